"""Client side of the per-session bidi streams to the draft and target services."""

from __future__ import annotations

import queue
import threading
import time

import grpc

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.runtime.security import open_channel
from specdec.runtime.server import KEEPALIVE_S, channel_options

_END = object()
STREAM_TIMEOUT_S = 3600.0


class StreamError(grpc.RpcError):
    """A stream call that failed on this side: its deadline passed, or the service ended the stream."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class SessionStream:
    """One bidi stream: `call` sends a request and waits, up to a deadline, for its reply."""

    def __init__(self, method, address: str = ""):
        self.address = address
        self._requests: queue.Queue = queue.Queue()
        self._responses = method(iter(self._requests.get, _END), timeout=STREAM_TIMEOUT_S)
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="stream-reader").start()

    def _read(self) -> None:
        try:
            for reply in self._responses:
                self._replies.put((reply, time.perf_counter()))
            self._replies.put((StreamError(grpc.StatusCode.UNAVAILABLE, f"{self.address} ended the stream"), 0.0))
        except grpc.RpcError as exc:
            self._replies.put((exc, 0.0))

    def call(self, request, timeout: float | None = None):
        """Returns (reply, wall seconds). Raises grpc.RpcError with the service's status, or
        DEADLINE_EXCEEDED after `timeout` seconds (the stream is then cancelled: unusable)."""
        return self.send(request).result(timeout)

    def send(self, request) -> "PendingCall":
        """Send `request` without waiting; its reply is the next one after those of earlier calls."""
        sent_at = time.perf_counter()
        self._requests.put(request)
        return PendingCall(self, sent_at)

    def _receive(self, sent_at: float, timeout: float | None):
        try:
            reply, arrived = self._replies.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise StreamError(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"{self.address} did not answer within {timeout:.1f} s") from None
        if isinstance(reply, grpc.RpcError):
            raise reply
        return reply, arrived - sent_at

    def close(self) -> None:
        """Half-close and cancel: the service releases the stream's sessions either way."""
        self._requests.put(_END)
        self._responses.cancel()


class PendingCall:
    """A request in flight on a `SessionStream`; `result` waits for its reply (in send order)."""

    def __init__(self, stream: SessionStream, sent_at: float):
        self.stream, self.sent_at = stream, sent_at

    def result(self, timeout: float | None = None):
        """(reply, wall seconds from send to the reply's arrival), or the call's grpc.RpcError.
        `timeout` counts from now."""
        return self.stream._receive(self.sent_at, timeout)

    def ready(self) -> bool:
        """Whether a reply (or the stream's error) is in, so that `result` would not wait: this call's, where no
        call sent before it is still waiting."""
        return not self.stream._replies.empty()


class ServiceClient:
    """A channel to a draft or a target service."""

    def __init__(self, address: str, stub_cls, keepalive_s: float = KEEPALIVE_S):
        self.address = address
        self.channel = open_channel(address, channel_options(keepalive_s))
        self.stub = stub_cls(self.channel)

    def wait_ready(self, timeout: float) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def info(self) -> pb.ModelInfo:
        return self.stub.Info(pb.ModelInfoRequest(), timeout=30)

    def open_stream(self) -> SessionStream:
        return SessionStream(self.stub.Session, self.address)

    def close(self) -> None:
        self.channel.close()


def draft_client(address: str, keepalive_s: float = KEEPALIVE_S) -> ServiceClient:
    return ServiceClient(address, pb_grpc.DraftServiceStub, keepalive_s)


def target_client(address: str, keepalive_s: float = KEEPALIVE_S) -> ServiceClient:
    return ServiceClient(address, pb_grpc.TargetServiceStub, keepalive_s)
