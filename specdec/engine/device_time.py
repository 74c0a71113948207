"""How long a forward pass kept its device busy, where the host does not wait for it to finish.

On CUDA a pass returns once its kernels are queued (the batcher does not wait: sampling and replies then
overlap the device's work), so the host's clock measures the launch, a fifth of a compiled step on an H200
(0.49 against 2.65 ms). What the batcher prices its waits by is the pass itself, so there it reads the time
between two CUDA events around the pass, once the device has reached the second: never a wait for the device.
"""

from __future__ import annotations

from collections import deque

import torch

MAX_OUTSTANDING = 16  # passes timed but not yet finished on the device; older ones are dropped unread


class DeviceTimes:
    """The device time of the latest finished pass, from events recorded around each pass on the current stream.

    `started()` before a pass and `stopped(mark)` after it (on the thread that queues the pass); `latest_s()`
    from any thread, under the caller's lock: reading an event that the device has not reached returns the
    previous figure, not a wait."""

    def __init__(self, device: torch.device):
        self.device = device
        self._outstanding: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque(maxlen=MAX_OUTSTANDING)
        self._latest_s: float | None = None

    def started(self) -> torch.cuda.Event:
        start = torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream(self.device))
        return start

    def stopped(self, start: torch.cuda.Event) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        self._outstanding.append((start, end))

    def latest_s(self) -> float | None:
        """Seconds of the latest pass the device has finished (None before the first)."""
        while self._outstanding and self._outstanding[0][1].query():
            start, end = self._outstanding.popleft()
            self._latest_s = start.elapsed_time(end) / 1e3
        return self._latest_s


def device_times(device: torch.device) -> DeviceTimes | None:
    """A `DeviceTimes` where passes run asynchronously to the host (CUDA), else None: the host's clock is the pass's."""
    return DeviceTimes(device) if device.type == "cuda" else None
