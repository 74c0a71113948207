"""Process entry point shared by the draft and target services.

`ModelServiceConfig` is a service's settings as data; `model_service_config` maps the flags of
`model_service_parser` to it, in the service's `__main__`. Nothing below takes a Namespace.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc
import torch

from specdec import weights
from specdec.core.ngram import LOOKUP_MEMORY_TOKENS
from specdec.engine.backend import GAMMA_LIMIT, Backend
from specdec.engine.model_engine import PREFIX_CACHE_BYTES, SHARED_SLOWDOWN, Engine
from specdec.engine.models import DRAFT_VOCAB_AUTO, imports_model_code, load_model
from specdec.engine.profile_cache import ProfileCache
from specdec.engine.requantize import DRAFT_WEIGHTS
from specdec.engine.session_table import MAX_SESSIONS
from specdec.planning.controller import GAMMA_MAX
from specdec.runtime import security, telemetry
from specdec.runtime.machine_lock import machine_lock
from specdec.runtime.options import add_options, from_options, option
from specdec.runtime.security import Security, security_from_args
from specdec.runtime.server import RunningServer, ServerConfig, announce_and_wait, configure_logging, start_server
from specdec.weights.packaged import Progress
from specdec.weights.sources import import_model_code

log = logging.getLogger(__name__)
PROGRESS_AFTER_S = 1.0  # a cost profile measured in less shows no progress


@dataclass(frozen=True)
class ModelServiceConfig(ServerConfig):
    """A draft or target service's settings; each field with `option` is also its flag."""

    model: str = option("", "packaged:draft|packaged:target, a Hugging Face folder, a .gguf file, "
                            "synthetic:draft|target or tiny:... (the draft service also takes `lookup`: no model, "
                            "n-gram lookups)")
    security: Security = Security()
    device: str = option("auto", "auto (CUDA when present), cpu, cuda, cuda:N")
    dtype: str = option("auto", "auto (on CPU: gguf-q8 for a GGUF model, else fp32; bf16 on CUDA), float32, "
                                "bfloat16, float16, gguf (a GGUF model's own weight blocks, exact float32 "
                                "arithmetic), gguf-q8 (those blocks, 8-bit activations, integer dot products)")
    quantize: str = option("none", "int8: the fast, lossy CPU path (int8 weights, per-token int8 activations; "
                                   "see docs/PERFORMANCE.md)", choices=("none", "int8"))
    runner: str = option("auto", "auto (static on CUDA, ragged on CPU), ragged (any shape, per-session caches) or "
                                 "static (a preallocated KV pool, fixed shapes, CUDA graphs on a GPU)",
                         choices=("auto", "ragged", "static"))
    context: int = option(0, "with the static runner: positions per session in its KV pool (0 = min(model's, 4096))")
    profile_tokens: int = option(GAMMA_MAX + 1, "at start-up, time forwards of 1..N new tokens (the cost profile the "
                                                "γ controller plans with; γ_max + 1)")
    grammar_warmup: str = option("startup", "build the grammars' view of the tokenizer (about 3 s for a 152k "
                                            "vocabulary) at start-up, after the cost profile, so that the first "
                                            "structured output does not wait for it; off: the first one builds it",
                                 choices=("startup", "off"))
    profile_cache: str = option("auto", "folder that keeps measured cost profiles (and gguf-q8's one-row setting) per "
                                        "model, path and CPU, so a restart does not re-time them; auto = profiles/ in the weights cache, off = "
                                        "measure every start (default: $SPECDEC_PROFILE_CACHE or auto)",
                                env="SPECDEC_PROFILE_CACHE")
    max_sessions: int = option(MAX_SESSIONS, "live sessions before RESOURCE_EXHAUSTED")
    gamma_max: int = option(GAMMA_LIMIT, "largest γ accepted per round", deprecated=("--max-gamma",))
    prefix_cache_mb: int = option(PREFIX_CACHE_BYTES >> 20, "MiB of ended sessions' KV caches kept for later sessions "
                                  "whose tokens start the same way (a chat's next turn, a shared system prompt), "
                                  "which then compute only the rest; 0 = off. On row-invariant paths only, where "
                                  "it changes no output. With the static runner kept caches hold pool slots until "
                                  "a new session needs one")
    prompt_slowdown: float = option(SHARED_SLOWDOWN, "beside sessions that are decoding, a prompt goes in chunks that "
                                    "keep each shared pass within this many times their pass alone (priced by the cost "
                                    "profile): they keep at least about 1/N of their speed while it goes in; larger "
                                    "feeds a long prompt faster and them slower (at least 1)")
    threads: int = option(0, "torch intra-op threads (0 = torch default)")
    redis_url: str = option("", "register this replica in Redis with TTL heartbeats (default: $SPECDEC_REDIS_URL)",
                            env="SPECDEC_REDIS_URL")
    advertise: str = option("", "HOST:PORT other services reach this replica at (default: this host name and port)",
                            env="SPECDEC_ADVERTISE")
    heartbeat_ttl_s: float = option(6.0, "seconds a registration outlives its last heartbeat (beats every ttl/3)",
                                    flag="--heartbeat-ttl")
    lookup_memory_tokens: int = option(LOOKUP_MEMORY_TOKENS, "with --model lookup: tokens of ended sessions kept for "
                                                             "lookups across sessions", flag="--lookup-memory")
    draft_vocab: int = option(-1, "the draft's output layer scores only token ids below N and the end-of-sequence "
                                  "ids (proposals never pick the others; output stays lossless); -1 = auto "
                                  f"({DRAFT_VOCAB_AUTO} for vocabularies of more than twice that, on the gguf-q8 "
                                  "path), 0 = every id")
    draft_weights: str = option("auto", "the draft's linear layers as its GGUF file ships them, or requantized at load "
                                        "to 4-bit Q4_0 (fewer bytes a step; a proposal's law may be any law, so the "
                                        "output stays lossless); auto = q4_0 on the gguf-q8 path",
                                choices=DRAFT_WEIGHTS)

    def cost_profile_cache(self) -> ProfileCache | None:
        if self.profile_cache == "off":
            return None
        if self.profile_cache == "auto":
            from specdec.weights import cache_root

            return ProfileCache(cache_root() / "profiles")
        return ProfileCache(Path(self.profile_cache))

    def advertised_address(self, port: int) -> str:
        if self.advertise:
            return self.advertise
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "[::]") else self.host
        return f"{host}:{port}"


# The registry, lookup memory, and the draft's output layer and weight format.
DRAFT_ONLY = ("redis_url", "advertise", "heartbeat_ttl_s", "lookup_memory_tokens", "draft_vocab", "draft_weights")


def model_service_parser(what: str, default_model: str, skip=()) -> argparse.ArgumentParser:
    """`ModelServiceConfig`'s flags (but `skip`), with `default_model`, and the security flags."""
    parser = argparse.ArgumentParser(prog=f"python -m {what}", description=f"specdec {what}")
    add_options(parser, ModelServiceConfig, skip=skip, defaults={"model": default_model})
    security.add_security_args(parser)
    return parser


def model_service_config(args: argparse.Namespace) -> ModelServiceConfig:
    """The flags of `model_service_parser` as configuration."""
    return from_options(ModelServiceConfig, args, security=security_from_args(args))


def setup_process(config: ModelServiceConfig, service_name: str, workers_per_node: int = 1) -> telemetry.Telemetry:
    """Logging, telemetry, torch threads and huge pages; CPU cores are split between the workers of one node.

    torch backs its large CPU allocations with transparent huge pages from here on (about 5% faster decode):
    it reads THP_MEM_ALLOC_ENABLE at its first large allocation, so the setting belongs to the process's
    start, never to an import (a test that imports a service's `__main__` keeps its own allocator)."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    configure_logging(config.log_level)
    security.use(config.security)
    installed = telemetry.configure(service_name, config.otlp_endpoint, config.trace_file)
    threads = config.threads or (max(1, (os.cpu_count() or 1) // workers_per_node) if workers_per_node > 1 else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    return installed


def load_engine(config: ModelServiceConfig, engine_cls: type[Engine], device: str | None = None,
                shard=None, draft_weights: str = "as-shipped") -> Engine:
    """The model of `config` on its compute path, in an engine with the configured limits; draft_weights: a
    draft's `config.draft_weights` (a target's weights stay as shipped)."""
    loaded = load_model(weights.resolve(config.model), device or config.device, config.dtype, config.quantize,
                        shard=shard, max_tokens=config.profile_tokens, runner=config.runner,
                        slots=config.max_sessions, context=config.context, draft_weights=draft_weights,
                        settings=config.cost_profile_cache())
    return engine_cls(loaded, max_sessions=config.max_sessions, gamma_max=config.gamma_max,
                      prefix_cache_bytes=config.prefix_cache_mb << 20, prompt_slowdown=config.prompt_slowdown)


def load_and_profile(config: ModelServiceConfig, load: Callable[[], Backend], sharded: bool = False) -> Backend:
    """`load()`, its cost profile and (`grammar_warmup`) its grammars' tokenizer, one service at a time on this
    machine (`machine_lock`), before it serves: built later, beside traffic, the tokenizer held the GIL for up to
    0.74 s at a time (the packaged vocabulary).

    transformers' model code, where the load needs it (`imports_model_code`; sharded: tensor parallelism), is
    imported first, outside the lock, so services starting together import in parallel; the profile comes from the
    cache when an earlier start measured it."""
    if imports_model_code(config.model, config.dtype, config.quantize, config.device, sharded):
        import_model_code()
    with machine_lock():
        engine = load()
        measure_costs(engine, config)
        grammars = getattr(engine, "grammars", None)
        if grammars is not None and config.grammar_warmup == "startup":
            try:
                grammars.warm()
            except Exception as exc:  # noqa: BLE001 - the first constrained session builds it, and says why not
                log.warning("grammar tokenizer not built at start-up: %s", exc)
    return engine


def measure_costs(engine: Backend, config: ModelServiceConfig) -> None:
    """The engine's cost profile, from the cache or measured. A measurement that runs past PROGRESS_AFTER_S (a first
    start on this machine: 5-20 s a model on a CPU) shows its progress on stderr (`Progress`: a bar on a terminal,
    else a line every 10 s and one at the end)."""
    cache = config.cost_profile_cache()
    name = config.model if ":" in config.model else Path(config.model).name
    began, bar = time.monotonic(), None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None and time.monotonic() - began >= PROGRESS_AFTER_S:
            bar = Progress(total, f"{name}: timing its passes{', once on this machine' if cache else ''}",
                           unit="tokens")
        if bar is not None:
            bar.update_to(done)

    try:
        engine.measure_costs(config.profile_tokens, cache, progress)
        if bar is not None:
            bar.finish()
    finally:
        if bar is not None:
            bar.close()


def serve_engine(engine: Backend, config: ModelServiceConfig, service_name: str,
                 register: Callable[[grpc.Server, Backend], None]) -> RunningServer:
    """Start the gRPC server for `engine` (any `Backend`: a model engine, a lookup engine, a
    tensor-parallel front)."""
    # Every session holds one stream; a few more calls (Info) may run beside them.
    return start_server(lambda server: register(server, engine), [service_name], config.host, config.port,
                        max_concurrent=config.max_sessions + 4, health_port=config.health_port,
                        keepalive_s=config.keepalive_s)


def run_model_service(config: ModelServiceConfig, *, what: str, build: Callable[[ModelServiceConfig], Backend],
                      service_name: str, register: Callable[[grpc.Server, Backend], None]) -> None:
    """Build (`build(config)`: load a model, usually), serve and (with a Redis URL) register a replica
    until SIGTERM."""
    installed = setup_process(config, f"specdec-{what.removesuffix('_service')}")
    log.info("loading %s on %s", config.model, config.device)
    engine = load_and_profile(config, lambda: build(config))
    running = serve_engine(engine, config, service_name, register)
    leave = None
    if config.redis_url:
        from specdec.runtime.redis_state import DraftRegistration, connect

        registration = DraftRegistration(connect(config.redis_url), config.advertised_address(running.port),
                                         lambda: (engine.live_sessions, engine.max_sessions), config.heartbeat_ttl_s)
        leave = registration.start().stop  # as the drain begins: no new session is routed here
    announce_and_wait(running, what, on_stop=lambda: [stop() for stop in (engine.close, installed.shutdown)],
                      drain_s=config.drain_timeout_s, on_drain=leave)
