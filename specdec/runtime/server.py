"""gRPC server bootstrap shared by the three servers: health, reflection, limits, shutdown."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specdec.runtime import security
from specdec.runtime.guards import Guard
from specdec.runtime.heap import freeze_startup_heap
from specdec.runtime.options import add_options, option

# Between services: dense q for γ=16 over a 152k vocabulary is ~10 MB.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# From clients to the orchestrator: a prompt is bounded far below this before it is tokenised.
MAX_CLIENT_MESSAGE_BYTES = 4 * 1024 * 1024
SPARE_WORKERS = 8  # threads kept free of work for health checks and reflection
READY_PREFIX = "SPECDEC_READY port="
PARENT_PID_ENV = "SPECDEC_PARENT_PID"  # set by a launcher: the service stops when that process is gone
KEEPALIVE_S = 20.0  # a connection silent this long is pinged, and closed if it stays so as long (`--keepalive-s`)
_CHANNEL_BASE = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 # A restarted service is found again within seconds, not gRPC's default two minutes.
                 ("grpc.initial_reconnect_backoff_ms", 250),
                 ("grpc.max_reconnect_backoff_ms", 2000),
                 # Each channel its own connections: with gRPC's process-wide pool a new channel to an address
                 # took over another channel's failed connection and its backoff, and its first call failed at
                 # once ("Connection refused") though a server now listened there (a restarted service, or a
                 # new server given a port an old one had: seen in CI).
                 ("grpc.use_local_subchannel_pool", 1)]


PING_STRIKES = 2  # pings under a server's floor it lets pass before it closes the connection (gRPC's default)


def keepalive_options(keepalive_s: float, *, client: bool = False) -> list[tuple[str, int]]:
    """Pings to the peer: a connection `keepalive_s` without traffic is pinged, and closed if the ping is not
    answered within `keepalive_s` more, idle connections included. So a server frees the sessions of a peer that
    vanished without closing (a host gone, a partition) within two periods, and a client's channel whose server
    vanished connects again (or fails fast) instead of sending each new call into a dead connection.

    A server also takes its peers' pings down to half its period apart (ours ping at the same `--keepalive-s`),
    and answers a connection that pings faster, with no data between, PING_STRIKES + 1 times in a row with
    GOAWAY `too_many_pings`, closing it: a ping flood costs the server a connection, not its threads. A gRPC
    client told so doubles its own period and connects again."""
    period_ms = max(int(keepalive_s * 1000), 100)
    options = [("grpc.keepalive_time_ms", period_ms), ("grpc.keepalive_timeout_ms", period_ms),
               # gRPC 1.85 waits this long for a ping's answer, not keepalive_timeout_ms (default: a minute)
               ("grpc.http2.ping_timeout_ms", period_ms),
               # a server's too: without it, gRPC judges a peer's pings on an idle connection by a 2-hour floor
               ("grpc.keepalive_permit_without_calls", 1),
               ("grpc.http2.max_pings_without_data", 0)]  # gRPC stops at 2 unanswered-by-data pings by default
    if client:
        return options
    return [*options, ("grpc.http2.min_ping_interval_without_data_ms", period_ms // 2),
            ("grpc.http2.max_ping_strikes", PING_STRIKES)]


def channel_options(keepalive_s: float = KEEPALIVE_S) -> list[tuple[str, int]]:
    """What every channel of ours sets: message limits, reconnection, its own connections, keepalive pings."""
    return [*_CHANNEL_BASE, *keepalive_options(keepalive_s, client=True)]


CHANNEL_OPTIONS = channel_options()

log = logging.getLogger(__name__)


DRAIN_TIMEOUT_S = 30.0  # how long calls in flight may run on once a server is told to stop (`--drain-timeout-s`)
CUT_WAIT_S = 5.0  # then how long cut streams have to reach their next message


class RunningServer:
    def __init__(self, server: grpc.Server, port: int, health_servicer: health.HealthServicer,
                 health_server: grpc.Server | None = None, guard: Guard | None = None):
        self.server, self.port, self.health, self.health_server = server, port, health_servicer, health_server
        self.guard = guard
        self.stopped = threading.Event()
        self.servicer: object | None = None  # what answers its calls, for inspection in this process

    def stop(self, grace: float = 2.0) -> None:
        self.stopped.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        if self.health_server is not None:
            self.health_server.stop(0)

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S, hurry: threading.Event | None = None) -> None:
        """Stop as a rolling update wants: health NOT_SERVING and new calls refused (UNAVAILABLE) at once, the
        calls in flight left to finish for up to `timeout_s` (or until `hurry` is set); those still running
        then end at their next message with UNAVAILABLE, their sessions freed, and the server stops."""
        self.stopped.set()
        self.health.enter_graceful_shutdown()
        if self.guard is not None:
            guard = self.guard
            guard.close()
            if not wait_for(lambda: guard.in_flight == 0, timeout_s, hurry):
                log.warning("%d calls still running after draining: ending them", guard.in_flight)
                guard.cut()
                wait_for(lambda: guard.in_flight == 0, CUT_WAIT_S)
        self.stop(grace=0.5)


def wait_for(done: Callable[[], bool], timeout_s: float, hurry: threading.Event | None = None,
             every_s: float = 0.05) -> bool:
    """Poll `done` until it holds (True), `timeout_s` has passed or `hurry` is set (False): a drain's wait."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if (hurry is not None and hurry.is_set()) or time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for a child to bind, or a rendezvous)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def start_server(register: Callable[[grpc.Server], None], service_names: list[str], host: str, port: int, *,
                 max_concurrent: int, max_receive_bytes: int = MAX_MESSAGE_BYTES,
                 health_port: int = 0, keepalive_s: float = KEEPALIVE_S) -> RunningServer:
    """Start a server with the given servicers plus grpc.health.v1 and reflection; returns its bound port.

    At most `max_concurrent` calls run at once (health and reflection aside, which keep
    SPARE_WORKERS threads of their own); past that a call gets RESOURCE_EXHAUSTED at once.
    TLS and the bearer token come from this process's `specdec.runtime.security` settings.
    `health_port`: also answer health checks there, in plaintext (probes that cannot speak TLS).
    `keepalive_s`: see `keepalive_options`.
    """
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", max_receive_bytes), *keepalive_options(keepalive_s)]
    guard = Guard(max_concurrent, security.current().tokens)
    server = grpc.server(ThreadPoolExecutor(max_workers=max_concurrent + SPARE_WORKERS), options=options,
                         interceptors=[guard])
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *service_names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    credentials = security.current().server_credentials()
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise SystemExit(f"cannot bind {host}:{port}")
    server.start()
    health_server = None
    if health_port:
        health_server = grpc.server(ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        if health_server.add_insecure_port(f"{host}:{health_port}") == 0:
            raise SystemExit(f"cannot bind the health port {host}:{health_port}")
        health_server.start()
    return RunningServer(server, bound, health_servicer, health_server, guard)


def stop_signals() -> tuple[threading.Event, threading.Event]:
    """SIGTERM/SIGINT set the first event (stop: drain); a second one sets the second (hurry: end the calls in
    flight now)."""
    stop, hurry = threading.Event(), threading.Event()

    def on_signal(*_) -> None:
        if stop.is_set():
            hurry.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return stop, hurry


SIGNAL_POLL_S = 0.2  # how often a process waiting for a stop signal looks for one handed to another thread


def wait_for_stop(stop: threading.Event) -> None:
    """Block until `stop` is set. A signal the kernel hands to a thread other than the main one only flags it
    for the main thread, whose Python handler runs the next time that thread runs Python: a bare `stop.wait()`
    would sleep through it (measured: 9.6 s, until a second signal came), so this wakes every SIGNAL_POLL_S."""
    while not stop.wait(SIGNAL_POLL_S):
        pass


def announce_and_wait(running, what: str, on_stop: Callable[[], None] | None = None,
                      drain_s: float = DRAIN_TIMEOUT_S, on_drain: Callable[[], None] | None = None) -> None:
    """Freeze the start-up heap (`freeze_startup_heap`), print the ready line a parent process waits for, then
    serve until SIGTERM/SIGINT, and drain (`running.drain`: `RunningServer`'s, or the HTTP API's): the calls in
    flight get `drain_s` to finish; a second signal ends them at once. `on_drain` runs as the drain begins (a
    replica leaves the registry, so that no new session is routed to it), `on_stop` once it has ended.

    Under a launcher (`PARENT_PID_ENV`), the service also stops once the launcher is gone, even
    by SIGKILL, and then exits at once: nobody is left to drain for.
    """
    stop, hurry = stop_signals()
    orphaned = threading.Event()
    parent = os.environ.get(PARENT_PID_ENV)
    if parent:
        threading.Thread(target=_stop_when_orphaned, args=(int(parent), stop, orphaned), daemon=True).start()
    frozen = freeze_startup_heap()
    log.info("%s serving on port %d (%d start-up objects out of the collector's walks)", what, running.port, frozen)
    print(f"{READY_PREFIX}{running.port}", flush=True)
    wait_for_stop(stop)
    if on_drain is not None:
        on_drain()
    if orphaned.is_set():
        running.stop(grace=0.0)
    else:
        log.info("%s draining: calls in flight get up to %.0f s (a second signal ends them now)", what, drain_s)
        running.drain(drain_s, hurry)
    log.info("%s stopped", what)
    if on_stop is not None:
        on_stop()
    if orphaned.is_set():
        exit_now(0, exit_handlers=False)  # nobody waits for what library atexit hooks would flush


def exit_now(code: int = 0, exit_handlers: bool = True) -> NoReturn:
    """End this process with `code` once its work is done, without the interpreter's teardown: finalizing the
    modules of torch, transformers and grpc takes about 1.1 s of CPU (2-core Zen 4) that frees nothing anyone
    needs, and a launcher waits for it, as a user waits for `specdec generate` to return. Logging and the
    standard streams are flushed and, with `exit_handlers`, atexit's handlers run first (telemetry's
    exporters, `ray.shutdown`); threads still running are ended with the process."""
    if exit_handlers:
        atexit._run_exitfuncs()  # what Py_Finalize would run first; private, stable since Python 3.0
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)


def _stop_when_orphaned(parent: int, stop: threading.Event, orphaned: threading.Event,
                        period_s: float = 0.2) -> None:
    """Set `stop` once the launching process has died, even by SIGKILL (no orphaned services)."""
    while not stop.wait(period_s):
        if os.getppid() != parent:
            log.warning("launcher %d is gone; shutting down", parent)
            orphaned.set()
            stop.set()


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@dataclass(frozen=True)
class ServerConfig:
    """What every server process takes: where it listens, what it logs, where its telemetry goes."""

    host: str = option("127.0.0.1", "address to bind")
    port: int = option(0, "port to bind (0 = any free port, printed when ready)")
    health_port: int = option(0, "also serve grpc.health.v1 in plaintext on this port, for probes when TLS is on "
                                 "(default: $SPECDEC_HEALTH_PORT; 0 = off)", env="SPECDEC_HEALTH_PORT")
    log_level: str = option("info", "debug, info, warning or error")
    otlp_endpoint: str = option("", "OTLP/gRPC collector for traces and metrics, e.g. http://127.0.0.1:4317 "
                                    "(default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset = no export)",
                                env="OTEL_EXPORTER_OTLP_ENDPOINT")
    trace_file: str = option("", "also append spans to this file as OTLP JSON lines (for `specdec profile --spans`)",
                             env="SPECDEC_TRACE_FILE")
    keepalive_s: float = option(KEEPALIVE_S, "ping a connection whose calls have been silent this long, and close it "
                                             "(ending its calls, freeing their sessions) if the ping goes unanswered "
                                             "as long again: a peer gone without closing its connection")
    drain_timeout_s: float = option(DRAIN_TIMEOUT_S, "on SIGTERM, how long calls in flight may finish while new ones "
                                                     "are refused (UNAVAILABLE) and health says NOT_SERVING; then "
                                                     "they end with UNAVAILABLE (a second signal: at once)")


TELEMETRY_OPTIONS = ("otlp_endpoint", "trace_file")


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """`ServerConfig`'s flags and the security flags."""
    add_options(parser, ServerConfig)
    security.add_security_args(parser)
