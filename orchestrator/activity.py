"""Whether this orchestrator is running any generation: a draft's feed between a conversation's turns runs only
while it is not, where the draft shares the target's cores (`Drafting.finish`)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Activity:
    """A count of the generations running, from any thread: each calls `begin` as it starts and `end` once.
    `stopping`: whether the server is stopping (then it is never idle: a feed ends, and the services drain)."""

    def __init__(self):
        self._live = 0
        self._lock = threading.Lock()
        self.stopping: Callable[[], bool] = lambda: False

    def begin(self) -> None:
        with self._lock:
            self._live += 1

    def end(self) -> None:
        with self._lock:
            self._live -= 1

    def idle(self) -> bool:
        """No generation is running."""
        return self._live <= 0

    def allows_feed(self, apart: bool) -> bool:
        """A draft may be fed beside whatever runs: the server is not stopping, and nothing runs or the draft
        computes `apart` from the target."""
        return not self.stopping() and (apart or self.idle())
