"""The per-session bidi stream loop shared by the draft and target servicers."""

from __future__ import annotations

import logging
from typing import Callable, Iterator

import grpc

from service_runtime.errors import grpc_errors
from service_runtime.wire import model_info_to_pb, sampling_from_pb
from specdec.engine import Engine
from specdec.errors import NotFound

log = logging.getLogger(__name__)


def serve_session_stream(requests: Iterator, context: grpc.ServicerContext, engine: Engine,
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

    def __init__(self, engine: Engine):
        self.engine = engine

    def _round(self, request):
        raise NotImplementedError

    def Session(self, request_iterator, context):
        return serve_session_stream(request_iterator, context, self.engine, self._round)

    def Info(self, request, context):
        e = self.engine
        return model_info_to_pb(e.loaded, e.max_gamma, e.live_sessions, e.max_sessions)
