"""The Responses API's routes: `POST /v1/responses` (whole, streamed, or in the background), a stored response's
`GET`, `DELETE` and `POST .../cancel`, and its input items. The request is read as a chat completion
(`specdec.http.responses_api`), its reply built by `specdec.http.response_reply`, stored by
`specdec.http.response_store`, and run apart by `specdec.http.background` when `background` is set.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specdec.http.calls import named_sse, run
from specdec.http.errors import BadRequest, rpc_error
from specdec.http.response_reply import MAX_LISTED, ResponseReply, ResponseStream, item_page
from specdec.http.responses_api import ResponsesRequest
from specdec.http.validation import parse

if TYPE_CHECKING:
    from specdec.http.app import Gateway


async def create_response(request: Request) -> Response:
    """The Responses API: a chat completion after the stored conversation it goes on from; stored in turn."""
    gateway: Gateway = request.app.state.gateway
    body = parse(ResponsesRequest, await request.body())
    gateway.check_model(body.model)
    conversation = []
    if body.previous_response_id:
        conversation = await asyncio.to_thread(gateway.stored.conversation, body.previous_response_id)
    try:
        chat, prompt = body.fitted(conversation, gateway.chat_prompt, gateway.info.max_context)
    except BadRequest as exc:
        raise BadRequest(str(exc), "input" if exc.param == "messages" else exc.param) from None
    reply = ResponseReply(body, gateway.model, gateway.tokens, chat.offered_tools(), gateway.stored)
    if body.background and reply.store is None:
        raise BadRequest("background responses are stored, and this server stores none (--response-store-mb 0)",
                         "background")
    generate = gateway.chat_request(chat, prompt, "max_output_tokens")
    return await run(request, gateway, body, [generate], reply, response_events)


async def stored_response(request: Request) -> Response:
    """GET a stored response (with `stream=true`, a background response's events after `starting_after`), or
    DELETE it (a background response still running stops first)."""
    gateway: Gateway = request.app.state.gateway
    response_id = request.path_params["response_id"]
    if request.method == "DELETE":
        await gateway.background.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
    body = await asyncio.to_thread(gateway.stored.body, response_id)
    if request.query_params.get("stream", "false") == "false":
        return JSONResponse(body)
    after = request.query_params.get("starting_after", "-1")
    if request.query_params["stream"] != "true" or not after.lstrip("-").isdigit():
        raise BadRequest("stream must be true or false, and starting_after a sequence number", "starting_after")
    return gateway.background.events(response_id, int(after))


async def cancel_response(request: Request) -> Response:
    """Cancel a background response (`specdec.http.background`): the response as it now stands."""
    gateway: Gateway = request.app.state.gateway
    return JSONResponse(await gateway.background.cancel(request.path_params["response_id"]))


async def input_items(request: Request) -> Response:
    """A stored response's input items, a page at a time (`order`, `limit`, `after`, as OpenAI's lists)."""
    gateway: Gateway = request.app.state.gateway
    query = request.query_params
    order, limit = query.get("order", "desc"), query.get("limit", "20")
    if order not in ("asc", "desc"):
        raise BadRequest(f"order must be asc or desc, got {order!r}", "order")
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_LISTED:
        raise BadRequest(f"limit must be an integer in [1, {MAX_LISTED}], got {limit!r}", "limit")
    items = await asyncio.to_thread(gateway.stored.items, request.path_params["response_id"])
    try:
        return JSONResponse(item_page(items, order, int(limit), query.get("after")))
    except ValueError as exc:
        raise BadRequest(str(exc), "after") from None


async def response_events(call, first, reply: ResponseReply, body) -> AsyncIterator[bytes]:
    """A streamed response's events (`ResponseStream`); an error after the first message ends it as failed.
    Closing the stream (the client went away) cancels the call."""
    events = ResponseStream(reply)
    try:
        async for batch in events.batches(call, first):
            if events.final is not None:  # stored before the client hears it is done
                await reply.settle(events.final)
            for event in batch:
                yield named_sse(event)
    except grpc.RpcError as exc:
        _, kind, message_text = rpc_error(exc)
        for event in events.failed(kind, message_text):
            yield named_sse(event)
    finally:
        call.cancel()
