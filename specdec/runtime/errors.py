"""Domain errors -> gRPC status codes, in one place for all three servers."""

from __future__ import annotations

import contextlib
import logging

import grpc

from specdec.core import errors

log = logging.getLogger(__name__)

STATUS_OF = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
}


@contextlib.contextmanager
def grpc_errors(context: grpc.ServicerContext):
    """Abort the RPC with the status that matches a domain error; anything else is INTERNAL."""
    try:
        yield
    except errors.SpecDecError as exc:
        context.abort(STATUS_OF[type(exc)], str(exc))
    except grpc.RpcError as exc:  # a downstream service failed: pass its status on
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNAVAILABLE
        if code == grpc.StatusCode.CANCELLED and not context.is_active():
            raise
        context.abort(code, f"downstream: {exc.details() if hasattr(exc, 'details') else exc}")
    except Exception as exc:  # noqa: BLE001 - a bug must reach the client as INTERNAL, with its message
        log.exception("internal error")
        context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
