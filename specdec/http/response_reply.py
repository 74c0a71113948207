"""The Responses API's reply: the response object, its output items, and a streamed response's events.

A reply's output is a message (its text, with the tokens' log-probabilities if asked for) and then one
`function_call` item per call read out of the text (`specdec.http.tool_calls`); a reply that is only calls has
no message. A streamed response sends OpenAI's events in order (`response.created`, `response.in_progress`,
the message's item, part and text deltas, each call's item and arguments, `response.completed`, or
`response.incomplete` when the reply ran out of tokens), each with its `sequence_number`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from specdec.http.calls import messages
from specdec.http.response_store import StoreUnavailable
from specdec.http.responses import Reply, TokenText
from specdec.http.responses_api import ResponsesRequest, new_id, output_message
from specdec.http.tool_calls import Tool, parse_calls

log = logging.getLogger(__name__)


class ResponseReply(Reply):
    """One response: its ids, the request's settings it repeats, and the chat reply it is built from."""

    def __init__(self, request: ResponsesRequest, model: str, tokens: TokenText, tools: dict[str, Tool],
                 store=None):
        """store: where the finished response goes (a `ResponseStore` or `RedisResponseStore`), if the
        request asks to be stored."""
        top = (request.top_logprobs or 0) if request.logprobs else None
        super().__init__("chat", model, tokens, top, tools)
        self.request = request
        self.id = new_id("resp")
        self.message_id = new_id("msg")
        self.created_at = int(time.time())
        self.store = store if request.store and store is not None and store.enabled else None
        self.part: list[dict] = []  # the chat messages this response adds to its conversation, once final

    def response(self, status: str, output: list[dict], usage: dict | None = None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "model": self.model, "output": output, "usage": usage, **self.request.echo()}

    def status(self) -> str:
        return "incomplete" if self.finish_reason() == "length" else "completed"

    def final(self, content: str, calls: list[dict], logprobs: list | None) -> dict:
        """The whole response object, from the reply's text (less its calls) and calls."""
        status = self.status()
        output = [self.message_item(status, content, logprobs)] if content or not calls else []
        output += [call_item(call, "completed") for call in calls]
        self.part = [*self.request.input_messages, output_message(content, calls)]
        return self.response(status, output, self.response_usage())

    async def settle(self, response: dict) -> None:
        """Store the final response, before the client hears of it (so that its id can be gone on from at
        once). A store that cannot be reached costs the response its place, not the reply."""
        if self.store is not None:
            try:
                if not await asyncio.to_thread(self.store.put, response["id"], response, self.part,
                                               self.request.previous_response_id, self.request.input_items()):
                    log.warning("response %s not stored: larger than the store", response["id"])
            except StoreUnavailable as exc:
                log.warning("response %s not stored: %s", response["id"], exc)

    def whole(self, texts: dict[int, str], logprobs: dict[int, dict | None]) -> dict:
        content, calls = parse_calls(texts.get(0, ""), self.tools) if self.tools else (texts.get(0, ""), [])
        merged = logprobs.get(0)
        return self.final(content or "", calls, merged["content"] if merged is not None else None)

    def message_item(self, status: str, text: str | None, logprobs: list | None = None) -> dict:
        """The message item; `text` None: its opening, before any part."""
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [] if text is None else [text_part(text, logprobs)]}

    def response_usage(self) -> dict:
        chat = self.usage()
        return {"input_tokens": chat["prompt_tokens"], "input_tokens_details": chat["prompt_tokens_details"],
                "output_tokens": chat["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": chat["total_tokens"], "speculation": chat["speculation"]}


def text_part(text: str, logprobs: list | None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def call_item(call: dict, status: str, arguments: str | None = None) -> dict:
    """A call (the chat API's shape) as a function_call item; `arguments` in place of the call's own."""
    function = call["function"]
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": function["name"], "arguments": function["arguments"] if arguments is None else arguments,
            "status": status}


class ResponseStream:
    """A streamed response's events, built as its text arrives; `final` is the response object once done."""

    def __init__(self, reply: ResponseReply):
        self.reply = reply
        self.sequence = 0
        self.text: list[str] = []
        self.logprobs: list | None = [] if reply.top is not None else None
        self.opened = False  # the message item has been announced
        self.final: dict | None = None

    def event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict]:
        response = self.reply.response("in_progress", [])
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def delta(self, text: str, logprobs: list | None) -> list[dict]:
        """A delta of the message's text (and its tokens' log-probabilities)."""
        events = [] if self.opened else self._open()
        self.text.append(text)
        if self.logprobs is not None:
            self.logprobs += logprobs or []
        events.append(self.event("response.output_text.delta", item_id=self.reply.message_id, output_index=0,
                                 content_index=0, delta=text, logprobs=logprobs or []))
        return events

    def finish(self) -> list[dict]:
        """The events after the last delta: the held text, the message's end, each call, then the response's end
        (`final` is set when this returns)."""
        rest, calls = self.reply.held()
        events = self.delta(rest, []) if rest else []
        text = "".join(self.text)
        final = self.reply.final(text, calls, self.logprobs)
        self.final = final
        items = iter(final["output"])
        if text or not calls:
            events += [] if self.opened else self._open()
            message = next(items)
            part, where = message["content"][0], {"item_id": message["id"], "output_index": 0, "content_index": 0}
            events += [self.event("response.output_text.done", **where, text=text, logprobs=self.logprobs or []),
                       self.event("response.content_part.done", **where, part=part),
                       self.event("response.output_item.done", output_index=0, item=message)]
        first_call = len(final["output"]) - len(calls)
        for index, (call, item) in enumerate(zip(calls, items), first_call):
            events += [self.event("response.output_item.added", output_index=index,
                                  item=call_item(call, "in_progress", arguments="")),
                       self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                  delta=item["arguments"]),
                       self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  name=item["name"], arguments=item["arguments"]),
                       self.event("response.output_item.done", output_index=index, item=item)]
        events.append(self.event(f"response.{final['status']}", response=final))
        return events

    async def batches(self, call, first) -> AsyncIterator[list[dict]]:
        """The events of the reply that `call` (its `first` message read) brings, in batches as its messages
        arrive: the start, each delta's, and last the finish's (`final` is set before that batch is yielded)."""
        yield self.start()
        reply = self.reply
        async for message in messages(call, first, reply):
            logprobs = reply.logprobs(message)
            text = reply.stream_text(message.text)
            if text or logprobs is not None and logprobs["content"]:
                yield self.delta(text, logprobs["content"] if logprobs is not None else None)
        yield self.finish()

    def failed(self, code: str, message: str) -> list[dict]:
        """An error after the response began: an error event, then the response as failed."""
        response = {**self.reply.response("failed", []), "error": {"code": code, "message": message}}
        return [self.event("error", code=code, message=message, param=None),
                self.event("response.failed", response=response)]

    def _open(self) -> list[dict]:
        self.opened = True
        where = {"item_id": self.reply.message_id, "output_index": 0, "content_index": 0}
        return [self.event("response.output_item.added", output_index=0,
                           item=self.reply.message_item("in_progress", None)),
                self.event("response.content_part.added", **where, part=text_part("", None))]


MAX_LISTED = 100  # OpenAI's largest `limit` for a list


def item_page(items: list[dict], order: str, limit: int, after: str | None) -> dict:
    """One page of a stored response's input items, as `GET /v1/responses/{id}/input_items` answers: `order`
    "asc" or "desc" (the default), at most `limit` (1-100) items, those after the item `after` names."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ValueError(f"after: no input item of this response has the id {after!r}")
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}
