"""Serve the OpenAI API with uvicorn: beside an orchestrator in this process (`specdec serve
--http-port`, `python -m orchestrator --http-port`) or alone (`python -m specdec.http`)."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass

import uvicorn

from specdec.http.app import create_app
from specdec.http.flags import HttpConfig
from specdec.runtime import security
from specdec.runtime.server import CUT_WAIT_S, DRAIN_TIMEOUT_S, wait_for

log = logging.getLogger(__name__)
START_TIMEOUT_S = 120.0


@dataclass
class RunningHttp:
    server: uvicorn.Server
    thread: threading.Thread
    host: str

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        scheme = "https" if self.server.config.ssl_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def stop(self, grace: float = 5.0) -> None:
        """Finish the requests in flight for up to `grace` seconds, then close (`drain`)."""
        self.drain(grace)

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S, hurry: threading.Event | None = None) -> None:
        """Stop taking connections and give the requests in flight `timeout_s` (or until `hurry` is set) to
        finish; those still running then end at their next message as the orchestrator ends a call its drain
        cut (`StoppableCall`): a stream with an error event and [DONE], a whole reply with a 503."""
        self.server.config.timeout_graceful_shutdown = timeout_s + CUT_WAIT_S
        self.server.should_exit = True
        wait_for(lambda: not self.thread.is_alive(), timeout_s, hurry)
        self.server.config.app.state.gateway.stopping.set()
        self.thread.join(timeout=CUT_WAIT_S + 5)


def uvicorn_config(config: HttpConfig, host: str, port: int, log_level: str) -> uvicorn.Config:
    """TLS with this process's certificate (clients authenticate with the bearer token, not a
    client certificate). No concurrency cap of uvicorn's: the orchestrator's answers 429 itself."""
    sec = security.current()
    tls = {}
    if sec.cert:
        tls = {"ssl_certfile": _pem_file(sec.cert), "ssl_keyfile": _pem_file(sec.key)}
    return uvicorn.Config(create_app(config), host=host, port=port, log_level=log_level, access_log=False,
                          lifespan="on", timeout_graceful_shutdown=5, **tls)


def _pem_file(pem: bytes) -> str:
    """uvicorn reads certificates from files: this process's PEM goes to a private temporary one,
    removed once the server has loaded it."""
    fd, path = tempfile.mkstemp(suffix=".pem")
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return path


def start_http(config: HttpConfig, host: str, port: int, log_level: str = "warning") -> RunningHttp:
    """Start the HTTP server on a thread of its own; returns once it accepts connections."""
    server = uvicorn.Server(uvicorn_config(config, host, port, log_level))
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starter below
            failed.append(exc)

    thread = threading.Thread(target=serve, daemon=True, name="http-api")
    thread.start()
    for _ in range(int(START_TIMEOUT_S / 0.05)):
        if server.started or failed or not thread.is_alive():
            break
        time.sleep(0.05)
    for pem in (server.config.ssl_certfile, server.config.ssl_keyfile):  # loaded by now (or never will be)
        if pem:
            os.unlink(pem)
    if not server.started:
        server.should_exit = True
        raise RuntimeError(f"the HTTP API did not start on {host}:{port}: {failed[0] if failed else 'timed out'}")
    running = RunningHttp(server, thread, "127.0.0.1" if host in ("0.0.0.0", "::") else host)
    log.info("OpenAI-compatible API on %s", running.url)
    return running
