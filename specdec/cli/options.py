"""The flags every `specdec` subcommand shares, and their mapping to `StackOptions`.

The orchestrator's own flags come from `orchestrator.flags` (defined once, used here and by
`python -m orchestrator`); this is the only place where they meet an argparse Namespace.
"""

from __future__ import annotations

import argparse

from orchestrator.flags import add_orchestrator_args
from specdec.launch.stack import StackOptions
from specdec.runtime.security import add_security_args, security_flags
from specdec.runtime.server import add_compute_path_args
from specdec.runtime.telemetry import add_telemetry_args


def add_stack_args(parser: argparse.ArgumentParser) -> None:
    """Models, compute path, the orchestrator's settings, telemetry and security of a local stack."""
    parser.add_argument("--draft-model", default="packaged:draft",
                        help="packaged:draft (default), a Hugging Face folder, a .gguf file or tiny:...")
    parser.add_argument("--target-model", default="packaged:target",
                        help="packaged:target (default), a Hugging Face folder, a .gguf file or tiny:...")
    add_compute_path_args(parser)  # for both models
    parser.add_argument("--target-tp", type=int, default=1,
                        help="tensor-parallel workers for the target (gloo on CPU, nccl on CUDA)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--draft-cpus", default="", help="pin the draft services to these CPUs (taskset list, e.g. 0), "
                        "one torch thread per CPU; with --target-cpus it stands in for separate machines")
    parser.add_argument("--target-cpus", default="", help="pin the target service to these CPUs (e.g. 1)")
    add_orchestrator_args(parser)
    add_telemetry_args(parser)
    add_security_args(parser)


def gamma_arg(value: str) -> int | None:
    """--gamma: "auto" (None, adaptive) or a fixed γ >= 0."""
    if value == "auto":
        return None
    gamma = int(value)
    if gamma < 0:
        raise argparse.ArgumentTypeError("gamma must be auto or an integer >= 0")
    return gamma


def stack_options(args: argparse.Namespace, **overrides) -> StackOptions:
    """The stack the flags of `add_stack_args` describe; `overrides` replace single fields."""
    fields = dict(draft_model=args.draft_model, target_model=args.target_model, device=args.device,
                  dtype=args.dtype, quantize=args.quantize, gamma_max=args.gamma_max,
                  max_new_tokens_limit=args.max_new_tokens_limit, max_sessions=args.max_concurrent,
                  log_level=args.log_level, target_tp=args.target_tp, otlp_endpoint=args.otlp_endpoint,
                  trace_file=args.trace_file, redis_url=args.redis_url, round_timeout_s=args.round_timeout,
                  security_flags=tuple(security_flags(args)), proposer=args.proposer,
                  overlap=args.overlap, lookup_memory_tokens=args.lookup_memory, draft_cpus=args.draft_cpus,
                  target_cpus=args.target_cpus)
    return StackOptions(**{**fields, **overrides})
