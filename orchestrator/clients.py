"""Client side of the per-session bidi streams to the draft and target services."""

from __future__ import annotations

import queue
import time

import grpc

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from service_runtime.server import CHANNEL_OPTIONS

_END = object()
STREAM_TIMEOUT_S = 3600.0


class SessionStream:
    """One bidi stream: `call` sends a request and blocks for its reply."""

    def __init__(self, method):
        self._requests: queue.Queue = queue.Queue()
        self._responses = method(iter(self._requests.get, _END), timeout=STREAM_TIMEOUT_S)

    def call(self, request):
        """Returns (reply, wall seconds). Raises grpc.RpcError with the service's status."""
        began = time.perf_counter()
        self._requests.put(request)
        reply = next(self._responses)
        return reply, time.perf_counter() - began

    def close(self) -> None:
        """Half-close and cancel: the service releases the stream's sessions either way."""
        self._requests.put(_END)
        self._responses.cancel()


class ServiceClient:
    """A channel to a draft or a target service."""

    def __init__(self, address: str, stub_cls):
        self.address = address
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = stub_cls(self.channel)

    def wait_ready(self, timeout: float) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def info(self) -> pb.ModelInfo:
        return self.stub.Info(pb.ModelInfoRequest(), timeout=30)

    def open_stream(self) -> SessionStream:
        return SessionStream(self.stub.Session)

    def close(self) -> None:
        self.channel.close()


def draft_client(address: str) -> ServiceClient:
    return ServiceClient(address, pb_grpc.DraftServiceStub)


def target_client(address: str) -> ServiceClient:
    return ServiceClient(address, pb_grpc.TargetServiceStub)
