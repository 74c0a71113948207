"""Process entry point shared by the draft and target services.

`ModelServiceConfig` is a service's settings as data; `model_service_config` maps the flags of
`model_service_parser` to it, in the service's `__main__`. Nothing below takes a Namespace.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc
import torch

from specdec import weights
from specdec.core.ngram import LOOKUP_MEMORY_TOKENS
from specdec.engine.model_engine import Engine
from specdec.engine.models import load_model
from specdec.engine.profile_cache import ProfileCache
from specdec.runtime import security, telemetry
from specdec.runtime.machine_lock import machine_lock
from specdec.runtime.security import Security, security_from_args
from specdec.runtime.server import RunningServer, add_model_args, announce_and_wait, configure_logging, start_server
from specdec.weights.sources import import_model_code

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelServiceConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 0
    health_port: int = 0  # plaintext grpc.health.v1 for probes when TLS is on (0 = off)
    log_level: str = "info"
    otlp_endpoint: str = ""
    trace_file: str = ""
    security: Security = Security()
    device: str = "auto"
    dtype: str = "auto"
    quantize: str = "none"
    profile_tokens: int = 9  # the start-up cost profile times forwards of 1..N tokens (γ_max + 1)
    profile_cache: str = "auto"  # folder of measured profiles; auto: in the weights cache; off: none
    max_sessions: int = 64
    max_gamma: int = 16
    threads: int = 0  # torch intra-op threads (0 = torch's default)
    redis_url: str = ""  # register this replica in Redis (draft services)
    advertise: str = ""  # HOST:PORT peers reach it at (default: this host and port)
    heartbeat_ttl_s: float = 6.0
    lookup_memory_tokens: int = LOOKUP_MEMORY_TOKENS  # a lookup draft service's memory across sessions

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


def model_service_parser(what: str, default_model: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {what}", description=f"specdec {what}")
    add_model_args(parser, default_model)
    return parser


def add_registry_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=os.environ.get("SPECDEC_REDIS_URL", ""),
                        help="register this replica in Redis with TTL heartbeats (default: $SPECDEC_REDIS_URL)")
    parser.add_argument("--advertise", default=os.environ.get("SPECDEC_ADVERTISE", ""),
                        help="HOST:PORT other services reach this replica at (default: this host name and port)")
    parser.add_argument("--heartbeat-ttl", type=float, default=6.0,
                        help="seconds a registration outlives its last heartbeat (beats every ttl/3)")


def model_service_config(args: argparse.Namespace) -> ModelServiceConfig:
    """The flags of `model_service_parser` (and `add_registry_args`, if added) as configuration."""
    return ModelServiceConfig(
        model=args.model, host=args.host, port=args.port, health_port=args.health_port, log_level=args.log_level,
        otlp_endpoint=args.otlp_endpoint, trace_file=args.trace_file, security=security_from_args(args),
        device=args.device, dtype=args.dtype, quantize=args.quantize, profile_tokens=args.profile_tokens,
        profile_cache=args.profile_cache,
        max_sessions=args.max_sessions, max_gamma=args.max_gamma, threads=args.threads,
        redis_url=getattr(args, "redis_url", ""), advertise=getattr(args, "advertise", ""),
        heartbeat_ttl_s=getattr(args, "heartbeat_ttl", 6.0),
        lookup_memory_tokens=getattr(args, "lookup_memory", LOOKUP_MEMORY_TOKENS))


def setup_process(config: ModelServiceConfig, service_name: str, workers_per_node: int = 1) -> telemetry.Telemetry:
    """Logging, telemetry and torch threads; CPU cores are split between the workers of one node."""
    configure_logging(config.log_level)
    security.use(config.security)
    installed = telemetry.configure(service_name, config.otlp_endpoint, config.trace_file)
    threads = config.threads or (max(1, (os.cpu_count() or 1) // workers_per_node) if workers_per_node > 1 else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    return installed


def load_engine(config: ModelServiceConfig, engine_cls: type[Engine], device: str | None = None,
                shard=None) -> Engine:
    """The model of `config` on its compute path, in an engine with the configured limits."""
    loaded = load_model(weights.resolve(config.model), device or config.device, config.dtype, config.quantize,
                        shard=shard, max_tokens=config.profile_tokens)
    return engine_cls(loaded, max_sessions=config.max_sessions, max_gamma=config.max_gamma)


def load_and_profile(config: ModelServiceConfig, load: Callable[[], Engine]) -> Engine:
    """`load()` and its cost profile, one service at a time on this machine (`machine_lock`).

    The model code is imported first, outside the lock, so services starting together import in
    parallel; the profile comes from the cache when an earlier start measured it."""
    import_model_code()
    with machine_lock():
        engine = load()
        engine.measure_costs(config.profile_tokens, config.cost_profile_cache())
    return engine


def serve_engine(engine, config: ModelServiceConfig, service_name: str,
                 register: Callable[[grpc.Server, Engine], None]) -> RunningServer:
    """Start the gRPC server for `engine` (an Engine or a tensor-parallel front with its interface)."""
    # Every session holds one stream; a few more calls (Info) may run beside them.
    return start_server(lambda server: register(server, engine), [service_name], config.host, config.port,
                        max_concurrent=config.max_sessions + 4, health_port=config.health_port)


def run_model_service(config: ModelServiceConfig, *, what: str, build: Callable[[ModelServiceConfig], Engine],
                      service_name: str, register: Callable[[grpc.Server, Engine], None]) -> None:
    """Build (`build(config)`: load a model, usually), serve and (with a Redis URL) register a replica
    until SIGTERM."""
    installed = setup_process(config, f"specdec-{what.removesuffix('_service')}")
    log.info("loading %s on %s", config.model, config.device)
    engine = load_and_profile(config, lambda: build(config))
    running = serve_engine(engine, config, service_name, register)
    stops = [installed.shutdown]
    if config.redis_url:
        from specdec.runtime.redis_state import DraftRegistration, connect

        registration = DraftRegistration(connect(config.redis_url), config.advertised_address(running.port),
                                         lambda: (engine.live_sessions, engine.max_sessions), config.heartbeat_ttl_s)
        stops.insert(0, registration.start().stop)
    announce_and_wait(running, what, on_stop=lambda: [stop() for stop in stops])
