"""Process entry point shared by the draft and target services."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from typing import Callable

import grpc
import torch

from service_runtime import security, telemetry
from service_runtime.server import RunningServer, add_model_args, announce_and_wait, configure_logging, start_server
from specdec.cost_profile import machine_lock
from specdec.engine import Engine
from specdec.models import load_model
import weights

log = logging.getLogger(__name__)


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


def advertised_address(args: argparse.Namespace, port: int) -> str:
    if args.advertise:
        return args.advertise
    host = socket.gethostname() if args.host in ("0.0.0.0", "::", "[::]") else args.host
    return f"{host}:{port}"


def setup_process(args: argparse.Namespace, service_name: str, workers_per_node: int = 1) -> telemetry.Telemetry:
    """Logging, telemetry and torch threads; CPU cores are split between the workers of one node."""
    configure_logging(args.log_level)
    security.use(security.security_from_args(args))
    installed = telemetry.configure(service_name, args.otlp_endpoint, args.trace_file)
    threads = args.threads or (max(1, (os.cpu_count() or 1) // workers_per_node) if workers_per_node > 1 else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    return installed


def serve_engine(engine, args: argparse.Namespace, what: str, service_name: str,
                 register: Callable[[grpc.Server, Engine], None]) -> RunningServer:
    """Start the gRPC server for `engine` (an Engine or a tensor-parallel front with its interface)."""
    # Every session holds one stream; a few more calls (Info) may run beside them.
    return start_server(lambda server: register(server, engine), [service_name], args.host, args.port,
                        max_concurrent=args.max_sessions + 4, health_port=args.health_port)


def run_model_service(args: argparse.Namespace, *, what: str, engine_cls: type[Engine], service_name: str,
                      register: Callable[[grpc.Server, Engine], None]) -> None:
    """Load, serve and (with --redis-url) register a replica until SIGTERM."""
    installed = setup_process(args, f"specdec-{what.removesuffix('_service')}")
    log.info("loading %s on %s", args.model, args.device)
    with machine_lock():
        loaded = load_model(weights.resolve(args.model), args.device, args.dtype, args.quantize, max_tokens=args.profile_tokens)
        engine = engine_cls(loaded, max_sessions=args.max_sessions, max_gamma=args.max_gamma)
        engine.measure_costs(args.profile_tokens)
    running = serve_engine(engine, args, what, service_name, register)
    stops = [installed.shutdown]
    if args.redis_url:
        from service_runtime.redis_state import DraftRegistration, connect

        registration = DraftRegistration(connect(args.redis_url), advertised_address(args, running.port),
                                         lambda: (engine.live_sessions, engine.max_sessions), args.heartbeat_ttl)
        stops.insert(0, registration.start().stop)
    announce_and_wait(running, what, on_stop=lambda: [stop() for stop in stops])
