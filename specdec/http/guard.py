"""What the HTTP API checks before any route runs: the bearer token, then the body's size."""

from __future__ import annotations

import functools
import re
import time

from starlette.responses import Response

from specdec.http.errors import error_body

OPEN_PATHS = ("/health", "/metrics")  # probes and scrapers, like gRPC health, need no token


def route_of(path: str, routes) -> str:
    """The route a path is counted under: itself, the template it fills (`/v1/models/{model:path}`,
    `/v1/responses/{response_id}/input_items`), or "other"."""
    if path in routes:
        return path
    return next((route for route in sorted(routes) if "{" in route and template(route).fullmatch(path)), "other")


@functools.lru_cache(maxsize=64)
def template(route: str) -> re.Pattern:
    """A route template as a pattern: `{name}` one path segment, `{name:path}` the rest of the path."""
    parts = re.split(r"(\{[^}]*\})", route)
    return re.compile("".join(("(.+)" if part.endswith(":path}") else "([^/]+)") if part.startswith("{")
                              else re.escape(part) for part in parts))


class Guard:
    """ASGI middleware run before any route: the bearer token (401), then the body's size (413),
    read whole and bounded before anything parses it; it also counts requests by route and status
    (`gateway.requests`, `gateway.latency`)."""

    def __init__(self, app, gateway, routes):
        self.app, self.gateway, self.routes = app, gateway, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        began = time.perf_counter()
        response = self._refusal(scope)
        if response is None and scope["method"] == "POST":
            response, receive = await self._bounded_body(scope, receive)
        status = [response.status_code if response is not None else 500]

        async def send_watching(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if response is not None:
                await response(scope, receive, send_watching)
            else:
                await self.app(scope, receive, send_watching)
        finally:
            route = route_of(scope["path"], self.routes)
            self.gateway.requests.add(1, {"route": route, "status": status[0]})
            self.gateway.latency.record(time.perf_counter() - began, {"route": route})

    def _refusal(self, scope) -> Response | None:
        if scope["path"] in OPEN_PATHS:
            return None
        headers = dict(scope["headers"])
        if not self.gateway.security.authorized(headers.get(b"authorization", b"").decode("latin-1")):
            return error_body(401, "authentication_error", "missing or wrong bearer token")
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.gateway.config.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> Response:
        return error_body(413, "invalid_request_error",
                          f"request body over the limit of {self.gateway.config.max_body_bytes} bytes")

    async def _bounded_body(self, scope, receive):
        """Read the body (at most the limit); a route then reads it from memory."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return Response(status_code=499), receive
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.gateway.config.max_body_bytes:
                return self._too_large(), receive
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay
