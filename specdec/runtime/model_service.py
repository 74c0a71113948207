"""Process entry point shared by the draft and target services.

A service's settings are data (`ModelServiceConfig`, in `specdec.runtime.model_service_config` with
`model_service_parser` and `model_service_config`, which the service's `__main__` maps its flags with); nothing here
takes a Namespace.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import grpc
import torch

from specdec import weights
from specdec.engine.backend import Backend
from specdec.engine.lookup_engine import LOOKUP_MODEL
from specdec.engine.model_engine import Engine
from specdec.engine.models import imports_model_code, load_model
from specdec.runtime import security, telemetry
from specdec.runtime.machine_lock import machine_lock
from specdec.runtime.model_service_config import ModelServiceConfig
from specdec.runtime.server import RunningServer, announce_and_wait, configure_logging, start_server
from specdec.weights.packaged import Progress
from specdec.weights.sources import import_config_code, import_model_code

log = logging.getLogger(__name__)
PROGRESS_AFTER_S = 1.0  # a cost profile measured in less shows no progress


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
    """`load()` and its cost profile, one service at a time on this machine (`machine_lock`), then (`grammar_warmup`)
    its grammars' tokenizer, before it serves: built later, beside traffic, the tokenizer held the GIL for up to
    0.74 s at a time (the packaged vocabulary). The tokenizer is built after the lock, beside the next service's
    load, where the profile came from the cache (a restart: 2.8 s of one core a service for the packaged pair); a
    service that measured its profile builds it under the lock, so that a first start's measurements, this one's
    and the next service's, run alone.

    transformers' code that the load needs (`imports_model_code`: its model code, else its configuration code alone;
    none for lookups; sharded: tensor parallelism) is imported first, outside the lock, so services starting together
    import in parallel; the profile comes from the cache when an earlier start measured it."""
    if config.model != LOOKUP_MODEL:
        model_code = imports_model_code(config.model, config.dtype, config.quantize, config.device, sharded)
        (import_model_code if model_code else import_config_code)()
    with machine_lock():
        engine = load()
        measured = measure_costs(engine, config)
        if measured:
            warm_grammars(engine, config)
    if not measured:
        warm_grammars(engine, config)
    return engine


def warm_grammars(engine: Backend, config: ModelServiceConfig) -> None:
    """Build the engine's grammars' tokenizer now, if it has grammars and `grammar_warmup` asks for it."""
    grammars = getattr(engine, "grammars", None)
    if grammars is not None and config.grammar_warmup == "startup":
        try:
            grammars.warm()
        except Exception as exc:  # noqa: BLE001 - the first constrained session builds it, and says why not
            log.warning("grammar tokenizer not built at start-up: %s", exc)


def measure_costs(engine: Backend, config: ModelServiceConfig) -> bool:
    """The engine's cost profile, from the cache or measured; whether it was measured. A measurement that runs past
    PROGRESS_AFTER_S (a first start on this machine: 5-20 s a model on a CPU) shows its progress on stderr
    (`Progress`: a bar on a terminal, else a line every 10 s and one at the end)."""
    cache = config.cost_profile_cache()
    name = config.model if ":" in config.model else Path(config.model).name
    began, bar, measured = time.monotonic(), None, False

    def progress(done: int, total: int) -> None:
        nonlocal bar, measured
        measured = True
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
    return measured


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
