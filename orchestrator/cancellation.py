"""A client's cancellation of one `Generate` call: a flag the generations poll between rounds, and the
aborts they register, run the moment it is set (a round in flight need not finish first)."""

from __future__ import annotations

import threading
from typing import Callable


class Cancellation:
    """Set once, by gRPC's callback when the client goes (or by the handler, to stop a call's other choices).
    `on_set(abort)`: run `abort` when it is set (at once if it already is)."""

    def __init__(self):
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._aborts: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._set.is_set()

    def set(self) -> None:
        with self._lock:
            self._set.set()
            aborts, self._aborts = self._aborts, []
        for abort in aborts:
            abort()

    def on_set(self, abort: Callable[[], None]) -> None:
        with self._lock:
            if not self._set.is_set():
                self._aborts.append(abort)
                return
        abort()
