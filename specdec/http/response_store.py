"""The Responses API's stored responses: what `previous_response_id` goes on from, and what
`GET /v1/responses/{id}` returns.

Each stored response keeps its own part of the conversation only (the chat messages its input added and
the one its output added) and the id it went on from; a conversation is the chain of those parts, read
oldest first. Reading a chain counts as using every response in it, so a conversation that goes on keeps
its whole chain; the least recently used go first once the stored bodies and messages pass the budget
(their JSON length). Plain Python, no web stack.

With Redis (`--redis-url`, as the distributed deployment runs) the responses live there instead, so that
every HTTP replica behind one address can go on from any of them: `specdec:response:<id>`, JSON, expiring
`--response-ttl-s` after its last use.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass


class ResponseNotFound(KeyError):
    """No stored response has this id (never stored, deleted, or dropped for room)."""


class StoreUnavailable(RuntimeError):
    """The store cannot be reached (Redis down)."""


class ResponseNotReady(ValueError):
    """A conversation cannot go on from this response: it is still running, or it failed or was cancelled
    (a background response: `specdec.http.background`). args: (response_id, status)."""


ENDED = ("completed", "incomplete")  # a response's statuses that a conversation can go on from
ACTIVE = ("queued", "in_progress")  # a background response's while it runs (`specdec.http.background`)


def response_store(config):
    """The store an HTTP server's config asks for (`HttpConfig`): Redis's if it names one, else its memory."""
    if config.redis_url:
        from specdec.runtime.redis_state import connect

        return RedisResponseStore(connect(config.redis_url), config.response_ttl_s)
    return ResponseStore(config.response_store_mb << 20)


@dataclass(frozen=True)
class StoredResponse:
    body: dict  # the response object as it was returned
    messages: list[dict]  # the chat messages it added: its input items', then its output's
    previous: str | None  # the response it went on from
    items: list[dict]  # its input items, as `GET /v1/responses/{id}/input_items` lists them
    size: int  # bytes counted against the budget


class Stored:
    """What both stores read the same way, from their `_use(response_id) -> StoredResponse` (which counts as a
    use, and raises ResponseNotFound)."""

    def body(self, response_id: str) -> dict:
        return self._use(response_id).body

    def items(self, response_id: str) -> list[dict]:
        return self._use(response_id).items

    def conversation(self, response_id: str) -> list[dict]:
        """The chat messages of the chain that ends at `response_id`, oldest first (ResponseNotReady if that one
        has not ended as `ENDED` says)."""
        parts: list[list[dict]] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None and at not in seen:
            seen.add(at)
            stored = self._use(at)
            if at == response_id and stored.body.get("status", "completed") not in ENDED:
                raise ResponseNotReady(response_id, stored.body["status"])
            parts.append(stored.messages)
            at = stored.previous
        return [message for part in reversed(parts) for message in part]

    def _use(self, response_id: str) -> StoredResponse:
        raise NotImplementedError


class ResponseStore(Stored):
    """Stored responses by id, least recently used out past `budget_bytes` (0: stores nothing)."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._stored: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def put(self, response_id: str, body: dict, messages: list[dict], previous: str | None,
            items: list[dict] = ()) -> bool:
        """Store a response; False if it alone is over the budget (then nothing is stored)."""
        items = list(items)
        size = len(json.dumps(body)) + len(json.dumps(messages)) + len(json.dumps(items))
        if size > self.budget_bytes:
            return False
        with self._lock:
            self._drop(response_id)
            self._stored[response_id] = StoredResponse(body, messages, previous, items, size)
            self._bytes += size
            while self._bytes > self.budget_bytes:
                self._drop(next(iter(self._stored)))
        return True

    def delete(self, response_id: str) -> None:
        with self._lock:
            if response_id not in self._stored:
                raise ResponseNotFound(response_id)
            self._drop(response_id)

    def cancel(self, response_id: str) -> dict:
        """Mark a running response cancelled, in one step with reading it (unless it has ended); its object as
        it then stands. (Its size stays counted as it was, two bytes over.)"""
        with self._lock:
            stored = self._stored.get(response_id)
            if stored is None:
                raise ResponseNotFound(response_id)
            if stored.body.get("status") in ACTIVE:
                stored = self._stored[response_id] = dataclasses.replace(stored, body={**stored.body, "status": "cancelled"})
            return stored.body

    def __len__(self) -> int:
        return len(self._stored)

    @property
    def bytes(self) -> int:
        """What the stored responses count against the budget."""
        return self._bytes

    def _use(self, response_id: str) -> StoredResponse:
        with self._lock:
            stored = self._stored.get(response_id)
            if stored is None:
                raise ResponseNotFound(response_id)
            self._stored.move_to_end(response_id)
            return stored

    def _drop(self, response_id: str) -> None:
        stored = self._stored.pop(response_id, None)
        if stored is not None:
            self._bytes -= stored.size


class RedisResponseStore(Stored):
    """Stored responses in Redis, shared by every HTTP server that names it; each expires `ttl_s` after its
    last use. The same calls as `ResponseStore`."""

    enabled = True

    def __init__(self, client, ttl_s: float):
        from specdec.runtime.redis_state import PREFIX

        self.client, self.ttl_s, self.prefix = client, max(int(ttl_s), 1), f"{PREFIX}:response:"

    def put(self, response_id: str, body: dict, messages: list[dict], previous: str | None,
            items: list[dict] = ()) -> bool:
        record = json.dumps({"body": body, "messages": messages, "previous": previous, "items": list(items)})
        self._call(self.client.set, self.prefix + response_id, record, ex=self.ttl_s)
        return True

    def delete(self, response_id: str) -> None:
        if not self._call(self.client.delete, self.prefix + response_id):
            raise ResponseNotFound(response_id)

    def cancel(self, response_id: str) -> dict:
        """As `ResponseStore.cancel`: read and marked in one transaction (WATCH / MULTI)."""
        key = self.prefix + response_id

        def mark(pipe) -> dict:
            value = pipe.get(key)
            if value is None:
                raise ResponseNotFound(response_id)
            record = json.loads(value)
            if record["body"].get("status") in ACTIVE:
                record["body"] = {**record["body"], "status": "cancelled"}
                pipe.multi()
                pipe.set(key, json.dumps(record), ex=self.ttl_s)
            return record["body"]

        return self._call(self.client.transaction, mark, key, value_from_callable=True)

    def _use(self, response_id: str) -> StoredResponse:
        value = self._call(self.client.getex, self.prefix + response_id, ex=self.ttl_s)
        if value is None:
            raise ResponseNotFound(response_id)
        return StoredResponse(**json.loads(value), size=len(value))

    @staticmethod
    def _call(method, *args, **kw):
        import redis

        try:
            return method(*args, **kw)
        except redis.RedisError as exc:
            raise StoreUnavailable(str(exc)) from None
