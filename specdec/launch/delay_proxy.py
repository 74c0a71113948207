"""A loopback TCP proxy that adds one-way delay and jitter: network emulation without netem.

Each direction of each connection delivers its bytes `delay_ms ± jitter_ms` after they
arrived, in order. The delay can be changed while the proxy runs. Both ends must be
loopback addresses: this is a test and benchmark tool, never a path to another host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import threading
import time

CHUNK = 1 << 16


def _require_loopback(host: str) -> None:
    address = socket.gethostbyname(host) if host == "localhost" else host.strip("[]")
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"the delay proxy only connects loopback addresses, not {host!r}")


class DelayProxy:
    """`with DelayProxy("127.0.0.1", port, delay_ms=10) as proxy: connect to proxy.address`."""

    def __init__(self, upstream_host: str, upstream_port: int, delay_ms: float = 0.0, jitter_ms: float = 0.0,
                 listen_host: str = "127.0.0.1", seed: int = 0):
        _require_loopback(upstream_host)
        _require_loopback(listen_host)
        self.upstream = (upstream_host, upstream_port)
        self.listen_host = listen_host
        self.delay_ms, self.jitter_ms = delay_ms, jitter_ms
        self.port = 0
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="delay-proxy")

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def start(self) -> "DelayProxy":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, self.listen_host, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown():
            self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._server is not None:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _one_way_delay_s(self) -> float:
        jitter = self._random.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
        return max(self.delay_ms + jitter, 0.0) / 1e3

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(self._pipe(client_reader, up_writer), self._pipe(up_reader, client_writer),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # proxy shutting down; end quietly (asyncio would report a cancelled handler)
            client_writer.close()
            up_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy reader -> writer, delivering each chunk after the one-way delay, never out of order."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(due - time.monotonic(), 0.0))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        last_due = 0.0
        try:
            while data := await reader.read(CHUNK):
                last_due = max(last_due, time.monotonic() + self._one_way_delay_s())
                queue.put_nowait((last_due, data))
            queue.put_nowait(None)
            await sender
        finally:
            sender.cancel()
            writer.close()
