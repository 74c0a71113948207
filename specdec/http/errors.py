"""Errors in OpenAI's JSON shape, with the HTTP status each gRPC status maps to."""

from __future__ import annotations

import grpc
from starlette.responses import JSONResponse

# gRPC status -> (HTTP status, OpenAI error type)
STATUS_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
}


class BadRequest(Exception):
    """A client's mistake: answered 400 with OpenAI's error shape. `param`: the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def error_body(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status)


def rpc_error(exc: grpc.RpcError) -> tuple[int, str, str]:
    """(HTTP status, OpenAI error type, message) for a failed call to the orchestrator; `rpc_param` names the
    field of a client's mistake."""
    status, kind = STATUS_OF.get(exc.code(), (500, "internal_error"))
    return status, kind, exc.details() or exc.code().name


# The orchestrator's names for a field the HTTP API takes under another name.
_HTTP_NAMES = {"prompt_token_ids": "prompt", "prediction_token_ids": "prediction"}


def rpc_param(exc: grpc.RpcError) -> str | None:
    """The request field a client's mistake names: the orchestrator's INVALID_ARGUMENT messages begin with it
    ("n must be in [1, 8], got 9"), named as the HTTP API takes it; None where the message begins with no
    field of a completion or chat request."""
    if exc.code() != grpc.StatusCode.INVALID_ARGUMENT or not exc.details():
        return None
    from specdec.http.schema import ChatCompletionRequest, CompletionRequest  # schema imports this module

    first = exc.details().split(maxsplit=1)[0]
    name = _HTTP_NAMES.get(first, first)
    return name if name in CompletionRequest.model_fields or name in ChatCompletionRequest.model_fields else None
