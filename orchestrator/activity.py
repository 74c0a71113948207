"""Whether this orchestrator is running any generation: a draft's feed between a conversation's turns runs only
while it is not, where the draft shares the target's cores (`Drafting.finish`)."""

from __future__ import annotations

import threading


class Activity:
    """A count of the generations running, from any thread: each calls `begin` as it starts and `end` once."""

    def __init__(self):
        self._live = 0
        self._lock = threading.Lock()

    def begin(self) -> None:
        with self._lock:
            self._live += 1

    def end(self) -> None:
        with self._lock:
            self._live -= 1

    def idle(self) -> bool:
        """No generation is running."""
        return self._live <= 0
