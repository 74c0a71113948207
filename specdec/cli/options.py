"""The flags every `specdec` subcommand shares, and their mapping to `StackOptions`.

The services' flags are their configs' options (`ModelServiceConfig`, `OrchestratorConfig`), the
same that `python -m draft_service` and `python -m orchestrator` take; this is the only place where
they meet an argparse Namespace.
"""

from __future__ import annotations

import argparse
import dataclasses

from orchestrator.flags import add_orchestrator_args, orchestrator_config
from specdec.launch.stack import StackOptions
from specdec.runtime.model_service_config import ModelServiceConfig
from specdec.runtime.options import add_options, from_options
from specdec.runtime.security import add_security_args, security_flags

# Both models' (draft_vocab and draft_weights: the draft's only).
STACK_SERVICE_OPTIONS = ("device", "dtype", "quantize", "runner", "context", "log_level", "otlp_endpoint",
                         "trace_file", "draft_vocab", "draft_weights", "prefix_cache_mb", "prompt_slowdown")


def add_stack_args(parser: argparse.ArgumentParser) -> None:
    """Models, compute path, the orchestrator's settings, telemetry and security of a local stack."""
    parser.add_argument("--draft-model", default=StackOptions.draft_model,
                        help="packaged:draft (default), a Hugging Face folder, a .gguf file, synthetic:draft or tiny:...")
    parser.add_argument("--target-model", default=StackOptions.target_model,
                        help="packaged:target (default), a Hugging Face folder, a .gguf file, synthetic:target or tiny:...")
    add_options(parser, ModelServiceConfig, only=STACK_SERVICE_OPTIONS,
                defaults={"log_level": StackOptions.service.log_level})
    parser.add_argument("--target-tp", type=int, default=StackOptions.target_tp,
                        help="tensor-parallel workers for the target (gloo on CPU, nccl on CUDA)")
    parser.add_argument("--draft-cpus", default="", help="pin the draft services to these CPUs (taskset list, e.g. 0), "
                        "one torch thread per CPU; with --target-cpus it stands in for separate machines")
    parser.add_argument("--target-cpus", default="", help="pin the target service to these CPUs (e.g. 1)")
    add_orchestrator_args(parser)
    add_security_args(parser)


def gamma_arg(value: str) -> int | None:
    """--gamma: "auto" (None, adaptive) or a fixed γ >= 0."""
    if value == "auto":
        return None
    gamma = int(value)
    if gamma < 0:
        raise argparse.ArgumentTypeError("gamma must be auto or an integer >= 0")
    return gamma


def positive_ints(text: str) -> list[int] | None:
    """Comma-separated integers >= 1 ("" gives []), or None if `text` is anything else."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        return None
    return values if all(v >= 1 for v in values) else None


def gamma_list(value: str) -> list[int]:
    """--gammas: fixed γ values, comma-separated integers >= 1 ("" for none)."""
    gammas = positive_ints(value)
    if gammas is None:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (adaptive always runs), got {value!r}")
    return gammas


def stack_options(args: argparse.Namespace, max_sessions: int | None = None, gamma_max: int | None = None,
                  grammar_warmup: str = StackOptions.service.grammar_warmup, **overrides) -> StackOptions:
    """The stack the flags of `add_stack_args` describe. The services take as many sessions as the
    orchestrator takes generations (or `max_sessions`); `gamma_max` overrides the flag; `grammar_warmup`:
    the services' (off: a one-shot generation or a benchmark does not wait for it); `overrides`
    replace single fields of StackOptions."""
    orchestrator = orchestrator_config(args)
    if gamma_max is not None:
        orchestrator = dataclasses.replace(orchestrator, gamma_max=gamma_max)
    sessions = max_sessions or orchestrator.max_concurrent
    service = from_options(ModelServiceConfig, args, only=STACK_SERVICE_OPTIONS, max_sessions=sessions,
                           redis_url=args.redis_url, grammar_warmup=grammar_warmup)
    fields = dict(draft_model=args.draft_model, target_model=args.target_model, service=service,
                  orchestrator=dataclasses.replace(orchestrator, max_concurrent=sessions), target_tp=args.target_tp,
                  security_flags=tuple(security_flags(args)), draft_cpus=args.draft_cpus,
                  target_cpus=args.target_cpus)
    return StackOptions(**{**fields, **overrides})
