"""The per-session bidi stream loop shared by the draft and target servicers."""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

import grpc
from opentelemetry.trace import SpanKind

from specdec.core.errors import NotFound
from specdec.engine.backend import Backend
from specdec.runtime import telemetry
from specdec.runtime.errors import grpc_errors
from specdec.runtime.wire import model_info_to_pb, sampling_from_pb

log = logging.getLogger(__name__)


def serve_session_stream(requests: Iterator, context: grpc.ServicerContext, engine: Backend,
                         handle: Callable) -> Iterator:
    """Answer each request of one stream with `handle(request)`.

    A request with `open` set creates its session first. Sessions belong to the stream that
    opened them and are released when it ends, fails or is cancelled by the client.
    """
    owned: set[str] = set()

    def release() -> None:
        for session_id in list(owned):
            if engine.release(session_id):
                log.info("released session %s", session_id)
            owned.discard(session_id)

    context.add_callback(release)
    try:
        with grpc_errors(context):
            for request in requests:
                if request.open:
                    engine.open(request.session_id, sampling_from_pb(request.sampling))
                    owned.add(request.session_id)
                elif request.session_id not in owned:
                    raise NotFound(f"unknown session {request.session_id!r} on this stream; "
                                   "open it first (open=true)")
                yield handle(request)
    finally:
        release()


class SessionServicer:
    """`Session` and `Info` over `self.engine`, shared by the draft and target servicers.

    Subclasses implement `_round(request) -> reply`, one protobuf translation of one engine call.
    """

    def __init__(self, engine: Backend):
        self.engine = engine

    span_name = "compute"

    def _round(self, request):
        raise NotImplementedError

    def _traced_round(self, request):
        """`_round` inside a server span that continues the caller's trace, with its KV rollback."""
        if not telemetry.tracing_enabled():
            return self._round(request)
        parent = telemetry.extract(request.trace_context)
        with telemetry.span(self.span_name, context=parent, kind=SpanKind.SERVER) as span:
            reply = self._round(request)
            if span.is_recording():
                ended = time.time_ns()
                span.set_attributes({"specdec.session_id": request.session_id,
                                     "specdec.committed_tokens_in": len(request.commit.tokens),
                                     "specdec.compute_ms": reply.compute_ns / 1e6,
                                     "specdec.forward_ms": reply.load.forward_ns / 1e6,
                                     "specdec.wait_ms": reply.load.wait_ns / 1e6})
                began = ended - reply.compute_ns  # the engine crops its cache first thing in the round
                telemetry.child_span(span, "kv.rollback", began, began + reply.rollback_ns,
                                     {"specdec.rolled_back_tokens": reply.rolled_back_tokens})
        return reply

    def Session(self, request_iterator, context):
        return serve_session_stream(request_iterator, context, self.engine, self._traced_round)

    def Info(self, request, context):
        with grpc_errors(context):
            return model_info_to_pb(self.engine)
