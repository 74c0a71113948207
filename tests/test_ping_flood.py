"""Pings a server takes and pings it refuses (`specdec.runtime.server.keepalive_options`). A peer that floods
a connection with HTTP/2 pings and no calls gets GOAWAY `too_many_pings` (ENHANCE_YOUR_CALM) and loses the
connection, while the server goes on answering; our own channels, which ping idle connections every
`keepalive_s`, keep theirs. A real server with health only, its period 2 s (a floor of 1 s between a peer's
pings). gRPC's own clients send at most a ping a second, so the flood speaks HTTP/2 on a plain socket."""

from __future__ import annotations

import socket
import struct
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_faults import SERVING, health

from specdec.runtime.server import channel_options, start_server

KEEPALIVE_S = 2.0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY = 0x4, 0x6, 0x7
ENHANCE_YOUR_CALM = 0xB
ACK = 0x1


@pytest.fixture
def server():
    running = start_server(lambda _: None, [], "127.0.0.1", 0, max_concurrent=2, keepalive_s=KEEPALIVE_S)
    yield running.port
    running.stop(0)


def frame(kind: int, payload: bytes = b"", flags: int = 0) -> bytes:
    """One HTTP/2 frame on stream 0."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", 0) + payload


def read_frames(sock: socket.socket, until: float):
    """(type, flags, payload) of each frame the server sends, until the connection closes or `until` passes."""
    data = b""
    while time.monotonic() < until:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            return
        data += chunk
        while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
            length = int.from_bytes(data[:3], "big")
            yield data[3], data[4], data[9:9 + length]
            data = data[9 + length:]


def flood_until_goaway(port: int, period_s: float, seconds: float) -> tuple[int, bytes] | None:
    """Ping a fresh connection every `period_s` for up to `seconds`; the GOAWAY's (error code, debug data) if the
    server sent one."""
    with socket.create_connection(("127.0.0.1", port), timeout=0.05) as sock:
        sock.sendall(PREFACE + frame(SETTINGS))
        stop, sending = threading.Event(), threading.Lock()

        def send(data: bytes) -> None:
            with sending:  # the pinger's frames and the answers never interleave
                sock.sendall(data)

        def ping() -> None:
            n = 0
            while not stop.is_set():
                try:
                    send(frame(PING, struct.pack(">Q", n)))
                except OSError:
                    return
                n += 1
                stop.wait(period_s)

        pinger = threading.Thread(target=ping, daemon=True)
        pinger.start()
        try:
            for kind, flags, payload in read_frames(sock, time.monotonic() + seconds):
                if kind == SETTINGS and not flags & ACK:
                    send(frame(SETTINGS, flags=ACK))
                if kind == PING and not flags & ACK:  # the server's own keepalive ping, answered
                    send(frame(PING, payload, flags=ACK))
                if kind == GOAWAY:
                    return struct.unpack(">I", payload[4:8])[0], payload[8:]
            return None
        finally:
            stop.set()
            pinger.join()


def healthy(channel: grpc.Channel) -> bool:
    """Health through `channel` itself (test_faults' `health` opens a channel of its own)."""
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status == SERVING


def test_a_ping_flood_gets_goaway_and_the_server_answers_on(server):
    goaway = flood_until_goaway(server, period_s=0.01, seconds=2 * KEEPALIVE_S)
    assert goaway is not None, "the server took a ping every 10 ms for two periods"
    assert goaway == (ENHANCE_YOUR_CALM, b"too_many_pings")
    assert health(f"127.0.0.1:{server}", timeout=2) == SERVING


def test_pings_at_a_period_keep_their_connection(server):
    """A peer pinging every period (as our channels do) never gets GOAWAY; neither does our own idle channel."""
    assert flood_until_goaway(server, period_s=KEEPALIVE_S, seconds=2.5 * KEEPALIVE_S) is None
    with grpc.insecure_channel(f"127.0.0.1:{server}", options=channel_options(KEEPALIVE_S)) as ours:
        assert healthy(ours)
        states: list[grpc.ChannelConnectivity] = []
        ours.subscribe(states.append)
        time.sleep(2.5 * KEEPALIVE_S)  # idle: only its pings cross, two of them
        assert healthy(ours)
        assert grpc.ChannelConnectivity.IDLE not in states and grpc.ChannelConnectivity.TRANSIENT_FAILURE not in states
