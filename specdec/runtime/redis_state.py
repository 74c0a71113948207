"""Shared state in Redis for the distributed deployment (the embedded default needs none of it).

Keys (all under `specdec:`):
- `draft:<address>`: a draft replica's record, JSON, expiring `ttl_s` after its last heartbeat;
- `session:<id>:request` (a hash: the request as parsed, its owner, the finish reason and the writer holding
  the record) and `session:<id>:tokens` (a list: the tokens committed so far): a generation's record, the
  request written once and each round's new tokens appended;
- `prior:<target model>`: the γ controller's shared prior for that target, JSON;
- `route:<digest>`: the draft replica that last served a sequence starting with the tokens the digest names
  (`specdec.core.sequence.prefix_digests`), expiring `ROUTE_TTL_S` after it was written;
- `response:<id>`: a stored response of the Responses API (`specdec.http.response_store`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from typing import Callable

import redis

from specdec.core.sequence import prefix_digests

log = logging.getLogger(__name__)
PREFIX = "specdec"
SESSION_TTL_S = 3600.0
ROUTE_TTL_S = 600.0  # a conversation's next turn comes within minutes, or finds its draft KV gone anyway


def connect(url: str) -> redis.Redis:
    """A client for `url` (redis://host:port/db); raises SystemExit with the reason if unreachable."""
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0, decode_responses=True)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise SystemExit(f"cannot reach Redis at {url}: {exc}") from exc
    return client


class DraftRegistration:
    """A draft replica's heartbeat: its record lives `ttl_s` past the last beat, then vanishes.

    `load()` returns (live_sessions, max_sessions), published with each beat.
    """

    def __init__(self, client: redis.Redis, address: str, load: Callable[[], tuple[int, int]], ttl_s: float):
        self.client, self.address, self.load, self.ttl_s = client, address, load, ttl_s
        self.key = f"{PREFIX}:draft:{address}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_forever, daemon=True)

    def start(self) -> "DraftRegistration":
        self.beat()
        self._thread.start()
        log.info("registered draft replica %s in Redis (ttl %.1f s)", self.address, self.ttl_s)
        return self

    def beat(self) -> None:
        live, cap = self.load()
        record = {"address": self.address, "live_sessions": live, "max_sessions": cap, "beat_at": time.time()}
        self.client.set(self.key, json.dumps(record), px=math.ceil(self.ttl_s * 1000))

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis away: the record expires and routing skips us
                log.warning("draft heartbeat failed: %s", exc)

    def stop(self, deregister: bool = True) -> None:
        """Stop beating and deregister at once (a clean shutdown). Without `deregister` the record
        expires after its TTL, as it does when the replica crashes. A beat under way is waited for, so that it
        cannot write the record again after the deregistration."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.ttl_s)
        if not deregister:
            return
        try:
            self.client.delete(self.key)
        except redis.RedisError:
            pass


def registered_drafts(client: redis.Redis) -> list[dict]:
    """The records of every draft replica whose heartbeat has not expired."""
    keys = list(client.scan_iter(f"{PREFIX}:draft:*"))
    values = client.mget(keys) if keys else []
    return [json.loads(v) for v in values if v]


class SessionStore:
    """Per-generation records, so that another orchestrator can resume a generation.

    A round's write grows with the tokens it committed, not with the prompt or the tokens before: the request is
    written once, when a writer takes the record, and each round appends its new tokens. One writer holds a
    record at a time. A resume takes it over, and from then on the old writer's rounds are refused, never
    appended after the new writer's tokens.
    """

    def __init__(self, client: redis.Redis, ttl_s: float = SESSION_TTL_S):
        self.client, self.ttl_s = client, max(int(ttl_s), 1)
        self.append_round = client.register_script(_APPEND_ROUND)  # (keys, args): see _APPEND_ROUND

    def record(self, session_id: str, request: dict) -> "SessionRecord":
        """A writer for `session_id`'s record; it takes the record over at its first save."""
        return SessionRecord(self, session_id, request)

    def load(self, session_id: str) -> dict | None:
        """The record as its last writer left it: the request's fields, `generated` and `finish_reason`."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(_request_key(session_id))
            pipe.lrange(_tokens_key(session_id), 0, -1)
            fields, tokens = pipe.execute()
        if "request" not in fields:
            return None
        return {**json.loads(fields["request"]), "generated": [int(t) for t in tokens],
                "finish_reason": fields.get("finish", "")}


def _request_key(session_id: str) -> str:
    return f"{PREFIX}:session:{session_id}:request"


def _tokens_key(session_id: str) -> str:
    return f"{PREFIX}:session:{session_id}:tokens"


# KEYS: the request hash, the token list. ARGV: the writer's fence, the TTL in seconds, the finish reason, the
# list's length before this round, then the round's new tokens. Returns 1 when appended; 0 when the record is
# not as this writer left it (expired, lost with Redis, or a write of unknown outcome), so the writer writes it
# whole; -1 when another writer has taken it over.
_APPEND_ROUND = """
local writer = redis.call('HGET', KEYS[1], 'writer')
if not writer then return 0 end
if writer ~= ARGV[1] then return -1 end
if redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[4]) then return 0 end
for first = 5, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
redis.call('HSET', KEYS[1], 'finish', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""


class SessionRecord:
    """One writer's hold on a generation's record (`SessionStore.record`)."""

    def __init__(self, store: SessionStore, session_id: str, request: dict):
        self.store, self.session_id, self.request = store, session_id, request
        self.fence = uuid.uuid4().hex
        self.saved: int | None = None  # tokens this writer knows the list holds; None: write it whole
        self.fenced = False

    def save(self, generated: list[int], finish: str) -> None:
        """Record every token committed so far and the finish reason ("" while running). Raises RedisError."""
        if self.fenced:
            return
        if self.saved is not None:
            keys = [_request_key(self.session_id), _tokens_key(self.session_id)]
            outcome = self.store.append_round(keys, [self.fence, self.store.ttl_s, finish, self.saved,
                                                     *generated[self.saved:]])
            if outcome == 1:
                self.saved = len(generated)
                return
            if outcome == -1:
                self.fenced = True
                log.info("session %s: resumed by another writer; this one no longer records it", self.session_id)
                return
        self._write_whole(generated, finish)

    def _write_whole(self, generated: list[int], finish: str) -> None:
        """Take the record: the request, this writer's fence and every token, in one transaction."""
        self.saved = None
        request_key, tokens_key = _request_key(self.session_id), _tokens_key(self.session_id)
        with self.store.client.pipeline(transaction=True) as pipe:
            pipe.delete(tokens_key)
            pipe.hset(request_key, mapping={"request": json.dumps(self.request), "finish": finish,
                                            "writer": self.fence})
            for first in range(0, len(generated), 10_000):
                pipe.rpush(tokens_key, *generated[first:first + 10_000])
            pipe.expire(request_key, self.store.ttl_s)
            pipe.expire(tokens_key, self.store.ttl_s)
            pipe.execute()
        self.saved = len(generated)


class PriorStore:
    """The γ controller's shared prior for one target model, shared by every orchestrator."""

    def __init__(self, client: redis.Redis, target_model: str):
        self.client, self.key = client, f"{PREFIX}:prior:{target_model}"

    def load(self) -> dict | None:
        value = self.client.get(self.key)
        return json.loads(value) if value else None

    def save(self, snapshot: dict) -> None:
        self.client.set(self.key, json.dumps(snapshot))


class SharedRoutes:
    """Which draft replica served each recent sequence, shared by every orchestrator through Redis, so that a
    chat's next turn finds the replica holding its draft KV whichever orchestrator it reaches. The same calls
    as the pool's own `Routes`, at the granularity of `block` tokens; Redis away, nothing is routed (a
    session then goes to the least loaded replica)."""

    def __init__(self, client: redis.Redis, block: int, ttl_s: float = ROUTE_TTL_S):
        self.client, self.block, self.ttl_s = client, block, max(int(ttl_s), 1)

    def remember(self, salt: str, tokens, address: str) -> None:
        digests = prefix_digests(salt, tokens, self.block)
        if not digests:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for digest in digests:
                    pipe.set(f"{PREFIX}:route:{digest}", address, ex=self.ttl_s)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("cannot write a draft route to Redis: %s", exc)

    def replica_for(self, salt: str, tokens) -> tuple[str, int] | None:
        """The replica of the remembered sequence sharing the most whole blocks with `tokens`, and the tokens
        of those blocks; or None."""
        digests = prefix_digests(salt, tokens, self.block)
        if not digests:
            return None
        try:
            found = self.client.mget([f"{PREFIX}:route:{digest}" for digest in digests])
        except redis.RedisError as exc:
            log.warning("cannot read the draft routes from Redis: %s", exc)
            return None
        blocks = next((k for k in range(len(found), 0, -1) if found[k - 1]), 0)
        return (found[blocks - 1], blocks * self.block) if blocks else None
