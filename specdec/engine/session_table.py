"""The live sessions of one service, by id, up to a cap: what every engine keeps the same way."""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

from specdec.core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted

S = TypeVar("S")
MAX_SESSIONS = 64  # a service's live sessions by default


class SessionTable(Generic[S]):
    """Sessions by id, at most `max_sessions`. Thread-safe; a session's own work holds its own lock."""

    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._sessions: dict[str, S] = {}
        self._lock = threading.Lock()

    def add(self, session_id: str, make: Callable[[], S]) -> None:
        """Open `session_id` with `make()`; refused for an empty or taken id, or at the cap."""
        if not session_id:
            raise InvalidArgument("session_id must be non-empty")
        with self._lock:
            if session_id in self._sessions:
                raise AlreadyExists(f"session {session_id!r} is already open")
            if len(self._sessions) >= self.max_sessions:
                raise ResourceExhausted(f"service is at its cap of {self.max_sessions} live sessions")
            self._sessions[session_id] = make()

    def get(self, session_id: str) -> S:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"unknown session {session_id!r}")
        return session

    def pop(self, session_id: str) -> S | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def values(self) -> list[S]:
        with self._lock:
            return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)
