"""The draft replicas an orchestrator can route sessions to.

Replicas come from a fixed list (`--draft a,b`) or from Redis, where each replica keeps a
record alive by heartbeat (`specdec.runtime.redis_state`). A new session goes to the healthy
replica with the lowest load: sessions it last reported, plus the sessions this orchestrator
opened on it since, over its session cap. A session whose tokens start like a recent one's
(a chat's next turn) goes back to the replica that served that one, which keeps its draft KV
(`specdec.engine.prefix_cache`), unless that replica carries a session more than the least loaded; with
Redis, every orchestrator shares those routes (`specdec.runtime.redis_state.SharedRoutes`).
A replica that failed a call is skipped for `cooldown_s`; a replica whose heartbeat stopped drops
out when its record expires.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import grpc
import numpy as np

from orchestrator.clients import ServiceClient, draft_client
from protos import specdec_pb2 as pb
from specdec.core.sequence import longest_shared
from specdec.planning.cost import CostProfile
from specdec.runtime.server import KEEPALIVE_S
from specdec.runtime.wire import cost_profile_from_pb

log = logging.getLogger(__name__)
ROUTES = 256  # recent sequences remembered with the replica that served them
ROUTE_MIN_TOKENS = 16  # a shorter shared start is not worth a detour (the services' own reuse minimum)


class Routes:
    """The replica that served each of this orchestrator's latest sequences, by cache salt: where a
    conversation's next turn finds its draft KV kept."""

    def __init__(self, capacity: int = ROUTES):
        self.capacity = capacity
        self._routes: OrderedDict[int, tuple[str, np.ndarray, str]] = OrderedDict()  # oldest first
        self._next_key = 0
        self._lock = threading.Lock()

    def remember(self, salt: str, tokens: Sequence[int], address: str) -> None:
        """`address` keeps `tokens`' draft KV. The latest route, where `tokens` only extend it (a feed that goes on,
        piece by piece: `Drafting.finish`), is replaced: a replica hands a kept cache to the session that extends
        it, so it no longer keeps the shorter one apart."""
        if len(tokens) < ROUTE_MIN_TOKENS:
            return
        tokens = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            if self._routes:
                latest = next(reversed(self._routes))
                route_salt, sequence, _ = self._routes[latest]
                if route_salt == salt and len(sequence) <= len(tokens) and \
                        np.array_equal(sequence, tokens[:len(sequence)]):
                    del self._routes[latest]
            self._routes[self._next_key] = (salt, tokens, address)
            self._next_key += 1
            while len(self._routes) > self.capacity:
                self._routes.popitem(last=False)

    def replica_for(self, salt: str, tokens: Sequence[int]) -> tuple[str, int] | None:
        """The replica of the remembered sequence of `salt` that shares the longest start with `tokens`
        (at least ROUTE_MIN_TOKENS; the latest wins a tie), and how many tokens it shares; or None."""
        with self._lock:
            remembered = [(address, sequence) for route_salt, sequence, address in reversed(self._routes.values())
                          if route_salt == salt]
        return longest_shared(tokens, remembered, ROUTE_MIN_TOKENS)


class DraftPool:
    def __init__(self, addresses: list[str] = (), registry=None, vocab_size: int | None = None,
                 cooldown_s: float = 2.0, routes=None, keepalive_s: float = KEEPALIVE_S):
        """No addresses and no registry: an empty pool (no replica: model drafting decodes target-only).
        `routes`: where sequences' replicas are remembered (`SharedRoutes`); default, this pool's own.
        `keepalive_s`: its channels' pings (`specdec.runtime.server.keepalive_options`)."""
        self.addresses, self.registry, self.keepalive_s = list(addresses), registry, keepalive_s
        self.vocab_size, self.cooldown_s = vocab_size, cooldown_s
        self._clients: dict[str, ServiceClient] = {}
        self._profiles: dict[str, CostProfile | None] = {}  # each replica's start-up cost profile
        self._gamma_max: dict[str, int] = {}  # the most tokens each replica drafts per call
        self._opened: dict[str, int] = {}  # sessions opened here and still running, per replica
        self._failed_at: dict[str, float] = {}
        self._refused: set[str] = set()
        self._routes = routes if routes is not None else Routes()
        self._lock = threading.Lock()

    def _candidates(self) -> list[dict]:
        if self.registry is None:
            return [{"address": a, "live_sessions": 0, "max_sessions": 1} for a in self.addresses]
        from specdec.runtime.redis_state import registered_drafts

        try:
            return registered_drafts(self.registry)
        except Exception as exc:  # noqa: BLE001 - Redis away: no replica known, decode target-only
            log.warning("cannot read the draft registry: %s", exc)
            return []

    def acquire(self, tokens: Sequence[int] = (), salt: str = "") -> tuple[ServiceClient | None, int]:
        """A healthy replica for a new session whose tokens are `tokens` (None: decode target-only): the
        one that served a recent sequence starting like them, if it carries at most one session more than
        the least loaded, else the least loaded. With it, how many of `tokens` it likely keeps the draft's KV
        of (the route's shared start where the session goes back to it, else 0): a guess, since the replica
        may have dropped them for later sessions' caches."""
        candidates = self._candidates()
        route = self._routes.replica_for(salt, tokens) if len(tokens) >= ROUTE_MIN_TOKENS else None
        routed, kept = route or (None, 0)
        tried: set[str] = set()
        while True:
            now = time.monotonic()
            with self._lock:  # choose and count in one step, so concurrent sessions spread out
                usable = [c for c in candidates if c["address"] not in self._refused | tried
                          and now - self._failed_at.get(c["address"], -1e9) >= self.cooldown_s]
                if not usable:
                    return None, 0

                def load(c: dict) -> float:
                    return (c["live_sessions"] + self._opened.get(c["address"], 0)) / max(c["max_sessions"], 1)

                least = min(usable, key=lambda c: (load(c), c["address"]))
                best = next((c["address"] for c in usable if c["address"] == routed
                             and load(c) <= load(least) + 1 / max(c["max_sessions"], 1) + 1e-9), least["address"])
                self._opened[best] = self._opened.get(best, 0) + 1
            client = self._client(best)
            if client is not None:
                return client, kept if best == routed else 0
            tried.add(best)
            with self._lock:
                self._opened[best] -= 1

    def _client(self, address: str) -> ServiceClient | None:
        """The channel to `address`; a new replica is first checked to share the target's vocabulary."""
        with self._lock:
            client = self._clients.get(address)
        if client is not None:
            return client
        client = draft_client(address, self.keepalive_s)
        try:
            info = client.stub.Info(pb.ModelInfoRequest(), timeout=5)
        except grpc.RpcError as exc:
            log.warning("draft replica %s does not answer (%s); skipping it", address, exc.code().name)
            client.close()
            with self._lock:
                self._failed_at[address] = time.monotonic()
            return None
        if self.vocab_size is not None and info.vocab_size not in (0, self.vocab_size):  # 0: any (a lookup)
            log.error("draft replica %s has vocabulary %d, the target %d: never used", address, info.vocab_size,
                      self.vocab_size)
            client.close()
            with self._lock:
                self._refused.add(address)
            return None
        with self._lock:
            self._profiles[address] = cost_profile_from_pb(info)
            self._gamma_max[address] = info.max_gamma
            return self._clients.setdefault(address, client)

    def profile(self, client: ServiceClient) -> CostProfile | None:
        """The cost profile `client`'s replica measured at start-up."""
        with self._lock:
            return self._profiles.get(client.address)

    def gamma_max(self, client: ServiceClient) -> int:
        """The most tokens `client`'s replica drafts in one call."""
        with self._lock:
            return self._gamma_max.get(client.address, 0)

    def release(self, client: ServiceClient | None) -> None:
        if client is not None:
            with self._lock:
                self._opened[client.address] = max(self._opened.get(client.address, 1) - 1, 0)

    def opened(self) -> dict[str, int]:
        """Sessions this orchestrator has open, per replica."""
        with self._lock:
            return dict(self._opened)

    def remember(self, salt: str, tokens: Sequence[int], address: str) -> None:
        """`address` served a session whose draft ended holding the KV of `tokens`: a session starting like
        them goes there."""
        self._routes.remember(salt, tokens, address)

    def failed(self, client: ServiceClient) -> None:
        """`client`'s replica failed a call: new sessions skip it for `cooldown_s`."""
        with self._lock:
            self._failed_at[client.address] = time.monotonic()
        log.warning("draft replica %s failed a call; skipping it for %.1f s", client.address, self.cooldown_s)
