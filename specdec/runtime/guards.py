"""What every server checks before a handler runs: well-formed messages, credentials, capacity.

One `grpc.ServerInterceptor`, shared by the three servers:
- a message that does not parse (garbage bytes, invalid UTF-8 in a string field) gets
  INVALID_ARGUMENT, not the INTERNAL that gRPC answers by default;
- with a token configured, a call without `authorization: Bearer <token>` gets UNAUTHENTICATED;
- past `max_concurrent` calls in flight, a new call gets RESOURCE_EXHAUSTED at once;
- once the server drains (`close`), a new call gets UNAVAILABLE, and after `cut` a streaming call in
  flight ends with UNAVAILABLE at its next message (its handler closed first, freeing what it holds).
Health and reflection are exempt from the last three: a probe must answer under any load, and the
server keeps spare worker threads for them (`start_server`).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable, Iterator

import grpc

from specdec.core.errors import InvalidArgument
from specdec.runtime.security import Security

EXEMPT_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
SHUTTING_DOWN = "the server is shutting down: retry on another replica"
CUT = "the server shut down before this call ended: retry on another replica"


class Malformed:
    """Stands in for a request that failed to parse; the handler wrapper rejects it."""

    def __init__(self, error: Exception):
        self.message = f"malformed request message: {type(error).__name__}: {str(error)[:200]}"


def credential_of(context: grpc.ServicerContext) -> str:
    """A stable, non-secret name for the caller's credential ("" when unauthenticated)."""
    presented = dict(context.invocation_metadata() or ()).get("authorization", "")
    return hashlib.sha256(str(presented).encode()).hexdigest()[:16] if presented else ""


def _tolerant(deserializer: Callable | None) -> Callable | None:
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 - any parse failure is the client's
            return Malformed(error)

    return parse


def _checked_stream(requests: Iterator) -> Iterator:
    """Yields the stream's requests; a malformed one raises InvalidArgument inside the handler."""
    for request in requests:
        if isinstance(request, Malformed):
            raise InvalidArgument(request.message)
        yield request


class _Slots:
    """A non-blocking counter of calls in flight."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.used -= 1


class Guard(grpc.ServerInterceptor):
    """`tokens`: the bearer tokens callers may present (none = no authentication)."""

    def __init__(self, max_concurrent: int, tokens: tuple[str, ...] = ()):
        self.slots = _Slots(max_concurrent)
        self.security = Security(tokens)
        self.closed = False  # draining: new calls are refused
        self.cutting = threading.Event()  # streaming calls in flight end at their next message

    @property
    def in_flight(self) -> int:
        """Calls running now (health and reflection aside)."""
        return self.slots.used

    def close(self) -> None:
        """Refuse every new call (UNAVAILABLE); those in flight go on."""
        self.closed = True

    def cut(self) -> None:
        """End the streaming calls in flight at their next message (UNAVAILABLE); unary ones run out."""
        self.closed = True
        self.cutting.set()

    def _authorized(self, metadata) -> bool:
        return self.security.authorized(str(dict(metadata or ()).get("authorization", "")))

    def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = continuation(details)
        if handler is None:
            return None
        exempt = details.method.startswith(EXEMPT_PREFIXES)
        refusal = None
        if not exempt and not self._authorized(details.invocation_metadata):
            refusal = (grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        return self._wrap(handler, exempt, refusal)

    def _wrap(self, handler: grpc.RpcMethodHandler, exempt: bool, refusal):
        streaming_in, streaming_out = handler.request_streaming, handler.response_streaming
        behavior = (handler.stream_stream if streaming_in and streaming_out else handler.stream_unary if streaming_in
                    else handler.unary_stream if streaming_out else handler.unary_unary)
        slots, cutting = self.slots, self.cutting

        def admit(context) -> bool:
            if refusal is not None:
                context.abort(*refusal)
            if exempt:
                return False
            if self.closed:
                context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
            if not slots.take():
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"server at capacity ({slots.limit} calls in flight); retry later")
            return True

        def first_check(request, context):
            if isinstance(request, Malformed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)

        if streaming_out:
            def run(request, context):
                if not streaming_in:
                    first_check(request, context)
                held = admit(context)
                replies = behavior(_checked_stream(request) if streaming_in else request, context)
                try:
                    for reply in replies:
                        yield reply
                        if held and cutting.is_set():
                            context.abort(grpc.StatusCode.UNAVAILABLE, CUT)
                finally:
                    if hasattr(replies, "close"):  # the handler's cleanup (sessions freed) before the status
                        replies.close()
                    if held:
                        slots.give()
        else:
            def run(request, context):
                if not streaming_in:
                    first_check(request, context)
                held = admit(context)
                try:
                    return behavior(_checked_stream(request) if streaming_in else request, context)
                finally:
                    if held:
                        slots.give()

        make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
        return make[(streaming_in, streaming_out)](run, request_deserializer=_tolerant(handler.request_deserializer),
                                                   response_serializer=handler.response_serializer)
