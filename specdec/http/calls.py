"""One request's Generate call, read for an HTTP reply: started, its first message awaited (so that a refused request
gets its 4xx status even when streamed), then gathered whole or streamed as server-sent events. A client that
disconnects cancels the call, which frees its session on every service.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import TYPE_CHECKING, AsyncIterator

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from protos import specdec_pb2 as pb
from specdec.http.errors import rpc_error, rpc_param
from specdec.http.responses import Reply
from specdec.runtime.guards import CUT

if TYPE_CHECKING:
    from specdec.http.app import Gateway


class ServerStopped(grpc.RpcError):
    """What a call reads once the HTTP server has stopped waiting for it: UNAVAILABLE, as the orchestrator says
    of a call that its own drain cut, so every reader ends it the same way (an error event, a 503)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return CUT


class StoppableCall:
    """A Generate call (or `PromptBatch`) that ends at its next message once `stopping` is set: cancelled, and
    read as `ServerStopped`."""

    def __init__(self, call, stopping: threading.Event):
        self.call, self.stopping = call, stopping

    async def read(self):
        message = await self.call.read()
        if self.stopping.is_set() and message is not grpc.aio.EOF:
            self.call.cancel()
            raise ServerStopped()
        return message

    def cancel(self) -> bool:
        return self.call.cancel()


def sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n".encode()


def named_sse(event: dict) -> bytes:
    """A Responses API event: its type as the event's name, the event as its data."""
    return f"event: {event['type']}\n".encode() + sse(event)


async def run(request: Request, gateway: Gateway, body, generate: list[pb.GenerateRequest], reply: Reply,
              events=None) -> Response:
    """Start the call (`generate`: a request per prompt, several read as one: `PromptBatch`) and wait for its first
    message, so that a refused request gets its 4xx status even when streamed; then stream the rest (`events`:
    the stream's form, the chat API's by default), or gather it."""
    call = gateway.generate(generate, reply.n)
    try:
        first = await until_disconnected(request, call.read())
    except BaseException:
        call.cancel()
        raise
    if getattr(body, "background", None):  # a Responses API request, run apart (`specdec.http.background`)
        started = await gateway.background.start(call, first, reply)
        if not body.stream:
            return JSONResponse(started)
        return gateway.background.events(reply.id)
    if body.stream:
        return event_stream((events or stream)(call, first, reply, body))
    try:
        whole = await until_disconnected(request, whole_reply(call, first, reply))
    finally:
        call.cancel()  # a no-op once the call is done
    await reply.settle(whole)
    return JSONResponse(whole)


def event_stream(chunks: AsyncIterator[bytes]) -> StreamingResponse:
    """Server-sent events, not to be cached or buffered on the way."""
    return StreamingResponse(chunks, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def messages(call, first, reply: Reply) -> AsyncIterator[pb.GenerateResponse]:
    """The call's messages from `first` on; the final stats go to `reply` as they pass."""
    message = first
    while message is not grpc.aio.EOF:
        if message.HasField("stats"):
            reply.stats[message.choice] = message.stats
        yield message
        message = await call.read()


async def whole_reply(call, first, reply: Reply) -> dict:
    """The call read to its end: the reply's object (not yet stored: `Reply.settle`), from each choice's text and
    its messages' logprobs."""
    texts: dict[int, list[str]] = {}
    logprobs: dict[int, list] = {}
    async for message in messages(call, first, reply):
        text, parts = reply.content(message)
        texts.setdefault(message.choice, []).append(text)
        logprobs.setdefault(message.choice, []).append(parts)
    return reply.whole({i: "".join(parts) for i, parts in texts.items()},
                       {i: reply.merge_logprobs(parts) for i, parts in logprobs.items()})


async def stream(call, first, reply: Reply, body) -> AsyncIterator[bytes]:
    """Server-sent events: a chunk per round, the finish reason, usage if asked for, then [DONE].
    An error after the first message arrives as an OpenAI error event. Closing the stream (the
    client went away) cancels the call."""
    opened: set[int] = set()  # choices whose first chunk (naming the role, in chat) has gone out
    try:
        async for message in messages(call, first, reply):
            text, logprobs = reply.content(message)
            index = message.choice
            text = reply.stream_text(text, index)
            if text or logprobs or index not in opened:
                yield sse(reply.chunk(text, logprobs, first=index not in opened, index=index))
                opened.add(index)
        for index in sorted(opened):
            for chunk in reply.closing_chunks(index):
                yield sse(chunk)
        if body.include_usage():
            yield sse(reply.usage_chunk())
    except grpc.RpcError as exc:
        status, kind, message_text = rpc_error(exc)
        yield sse({"error": {"message": message_text, "type": kind, "param": rpc_param(exc), "code": status}})
    finally:
        call.cancel()
    yield sse("[DONE]")


async def until_disconnected(request: Request, work):
    """Await `work`, unless the client disconnects first: then cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            raise ClientGone()
        return task.result()
    finally:
        watch.cancel()


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    pass
