"""Shared state in Redis for the distributed deployment (the embedded default needs none of it).

Keys (all under `specdec:`):
- `draft:<address>`: a draft replica's record, JSON, expiring `ttl_s` after its last heartbeat;
- `session:<id>`: a generation's committed state, JSON, rewritten every round;
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
    """Per-generation records, so that another orchestrator can resume a generation."""

    def __init__(self, client: redis.Redis, ttl_s: float = SESSION_TTL_S):
        self.client, self.ttl_s = client, ttl_s

    def save(self, session_id: str, record: dict) -> None:
        self.client.set(f"{PREFIX}:session:{session_id}", json.dumps(record), ex=int(self.ttl_s))

    def load(self, session_id: str) -> dict | None:
        value = self.client.get(f"{PREFIX}:session:{session_id}")
        return json.loads(value) if value else None


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
