"""Batches the forward steps of concurrent sessions into shared forward passes.

Each session's round (a draft step, a verify block, a prefill chunk) calls `forward(step)` and
blocks. One worker thread runs `ModelRunner.forward` over every step pending at that moment, so
sessions that compute at the same time share the weight traffic of one pass. Because the runner's
kernels and attention are row-invariant, a step's logits are the same bits whether it ran alone or
in a batch: batching changes speed, never output.

Before a pass the worker waits, briefly, for two kinds of sessions:
- those inside a round with no step pending yet (drafting sessions between steps): up to `max_wait_s`;
- those expected back: a session that left its last round `gap` ago, where `gap` is how long it
  usually stays away (an RPC round trip through the orchestrator), is waited for up to twice its gap,
  and never longer than `return_wait` × the last pass's duration (the device's, where the host does not wait
  for a pass to finish: `specdec.engine.device_time`). Its gap is the longest of its recent ones, each
  round's weighed down by `GAP_MEMORY`: sessions that leave one pass together come back one after another,
  in an order that changes every round, so a session back first last time may be back last now. Waited
  for up to twice its last gap alone, 8 users' sessions on a 2-core Zen 1 (gaps of 5-20 ms around passes of
  340 ms) left one behind in 12-15 of an adaptive burst's 68-69 passes, 8 with it (one traced run each): each
  such pass a row short, and the late session a token behind the others to the end. A recent gap is
  remembered only where twice it fits in the cap, that is where sessions are back within half a pass: where
  their round trips are as long as a pass (an H200's 2.3 ms passes), waiting for the slowest recent one held
  every pass back: 8 users ran 8-10% slower on an H200 than a build of two days before the memory, with
  fuller passes that waited longer (four alternating pairs); with passes padded to 2.5 ms on a CPU, the memory
  alone cost adaptive 8% and target-only 3% against the last gap (eleven alternating runs each).

Without the second wait, sessions split into groups that alternate passes (the ones that were out
for a round trip miss the pass that has just started), and every group gets one pass in two. With
it, sessions fall into lockstep. A session that stays away longer (drafting elsewhere, or done) is
not waited for; a lone session never waits.

On CUDA a lone session's step does not go to the worker at all: when no pass is running or pending, and
no other session is in a round or expected back, it runs on the calling thread. Handing a pass to the
worker and back costs two thread wake-ups, 85 µs a step on a 2-core Zen 4 with a pass that computes
nothing: 3% of a compiled target step on a GPU. Not on CPU, where the tiny test model's passes ran 5-10%
slower on the services' handler threads than on the worker (five alternating runs each), likely because
torch's intra-op threads are a team per calling thread and the handler thread changes with each stream;
the gguf-q8 path would gain 0.2% of its step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Hashable

import torch

from specdec.core.errors import Unavailable
from specdec.engine.device_time import DeviceTimes, device_times
from specdec.engine.runner import ModelRunner, Step

STALE_S = 60.0  # a session away this long is no longer expected back
GAP_MEMORY = 0.9  # a session's expected gap: max(its last gap, GAP_MEMORY × the one expected before)


@dataclass(frozen=True)
class PassShape:
    """The forward pass a step ran in: its sessions (rows) and their tokens together, how long it ran,
    and how long the step waited for it to begin (a shared pass forming, or the one before still running)."""

    rows: int
    tokens: int
    seconds: float = 0.0
    waited_s: float = 0.0


@dataclass
class _Pending:
    step: Step
    submitted: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    logits: torch.Tensor | None = None
    shape: PassShape | None = None
    error: BaseException | None = None


@dataclass
class _Away:
    left_at: float  # when the session's last round ended
    gap_s: float | None = None  # how long it is expected to stay away (`expected_gap`; None: not yet known)


def expected_gap(last_gap_s: float, expected_s: float | None, cap_s: float) -> float:
    """How long a session is expected to stay away between its rounds, after a gap of `last_gap_s`: the longest of
    its recent gaps, each round's weighed down by `GAP_MEMORY` (`expected_s`: what was expected before), where
    twice that fits in `cap_s` (the return wait's cap, about a pass); else the last gap alone.
    A remembered gap past half the cap asks for a wait as long as the pass it would save (see the module's
    docstring). A gap longer than `cap_s` is a session away on other work, not waited for, and
    is not remembered past its next round: remembered, a session back from drafting for 2 s was not waited for in
    the 18 rounds after, and 8 users' passes split into groups of 3 and 5 that took turns."""
    if expected_s is None or last_gap_s > cap_s or 2 * GAP_MEMORY * expected_s > cap_s:
        return last_gap_s
    return max(last_gap_s, GAP_MEMORY * expected_s)


class BatcherClosed(Unavailable):
    """A step was submitted to a closed batcher (the service is shutting down)."""


class StepBatcher:
    def __init__(self, runner: ModelRunner, max_wait_s: float = 0.002, max_tokens: int = 1024,
                 return_wait: float = 1.0, max_return_wait_s: float = 0.5, inline: bool | None = None,
                 pass_times: DeviceTimes | None = None):
        """inline: run a lone session's step on its calling thread (default: where the runner is on CUDA).
        pass_times: how long passes keep the device busy, where the host does not wait for them (default:
        CUDA events where the runner is on CUDA; elsewhere the host's clock times a pass)."""
        self.runner, self.max_wait_s, self.max_tokens = runner, max_wait_s, max_tokens
        device = getattr(runner, "device", torch.device("cpu"))
        self.inline = device.type == "cuda" if inline is None else inline
        self.pass_times = device_times(device) if pass_times is None else pass_times
        self.return_wait, self.max_return_wait_s = return_wait, max_return_wait_s
        self._pending: list[_Pending] = []
        self._active = 0  # sessions inside a round (see `taking_part`)
        self._away: dict[Hashable, _Away] = {}  # sessions between rounds, by key
        self._in_round: set[Hashable] = set()  # sessions inside a round, by key
        self._forgotten: set[Hashable] = set()  # of those, the ones forgotten meanwhile: not expected back after it
        self._last_pass_s = 0.0
        self._running = False  # a pass is running, on the worker or on a lone session's thread
        self._entered_at = 0.0  # when a session last entered a round
        self._cond = threading.Condition()
        self.forwards = 0  # forward passes run
        self.steps = 0  # steps they served
        self._closed = False
        self._worker = threading.Thread(target=self._work, daemon=True, name="step-batcher")
        self._worker.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker thread once it has run the steps already submitted; a step submitted later
        raises `BatcherClosed`. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker is not threading.current_thread():
            self._worker.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._worker.is_alive()

    def taking_part(self, key: Hashable | None = None) -> "_Participation":
        """Context manager around one session's round: its steps may be waited for. With a `key`
        (the session id) the session is also expected back after the round, until `forget(key)`."""
        return _Participation(self, key)

    def forget(self, key: Hashable) -> None:
        """The session is gone: do not wait for it."""
        with self._cond:
            self._away.pop(key, None)
            if key in self._in_round:
                self._forgotten.add(key)
            self._wake_if_ready()

    def forward(self, step: Step) -> torch.Tensor:
        """Run `step` (in a shared pass); returns its logits [step.logits, V]. Blocks until done."""
        return self.forward_shaped(step)[0]

    def forward_shaped(self, step: Step) -> tuple[torch.Tensor, PassShape]:
        """`forward`, and the shape of the pass it ran in (what the γ controller prices)."""
        pending = _Pending(step)
        with self._cond:
            if self._closed:
                raise BatcherClosed("the engine is closed")
            alone = self._alone(time.monotonic())
            if alone:
                self._running = True
            else:
                self._pending.append(pending)
                self._wake_if_ready()
        if alone:
            self._pass([pending])
        else:
            pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.logits, pending.shape

    def _alone(self, now: float) -> bool:
        """Under the lock: steps may run inline, no pass runs or waits, and no other session is in a round or
        expected back."""
        return self.inline and not self._running and not self._pending and self._active <= 1 and \
            self._returning_until(now) <= now

    def _pass(self, batch: list[_Pending]) -> None:
        """Run a pass taken while `_running` was set (by the worker, or inline by a lone session), then let
        the next one start: the worker waits for an inline pass to end before it takes the steps that came."""
        began = time.monotonic()
        mark = self.pass_times.started() if self.pass_times is not None else None
        try:
            self._run(batch)
        finally:
            if mark is not None:
                self.pass_times.stopped(mark)
            with self._cond:
                self._last_pass_s = self._pass_seconds(time.monotonic() - began)
                self._running = False
                self._cond.notify_all()

    def _pass_seconds(self, host_s: float) -> float:
        """How long a pass lasts, as the return wait's cap reads it: the host's time for the pass just run, or,
        where the device runs it after the host has moved on, the device's time for the latest it finished.
        Capped by the launch alone (0.49 ms on an H200, whose compiled step takes 2.65), a session a round
        trip away (1 ms and more) was never waited for, and 8 users' passes held 3.8 sessions."""
        device_s = self.pass_times.latest_s() if self.pass_times is not None else None
        return host_s if device_s is None else max(host_s, device_s)

    def _wake_if_ready(self) -> None:
        """Under the lock: wake the worker when it can act now, on the first step pending, or once every
        session in a round has a step pending and none is expected back. Otherwise its timed wait ends on
        its own, and waking it early costs a thread switch per session and step for nothing."""
        now = time.monotonic()
        if len(self._pending) == 1 or self._closed or \
                (len(self._pending) >= self._active and self._returning_until(now) <= now):
            self._cond.notify_all()

    def _return_cap(self) -> float:
        """The longest a pass waits for a session expected back: `return_wait` × the last pass, at most
        `max_return_wait_s`."""
        return min(self.max_return_wait_s, self.return_wait * self._last_pass_s)

    def _returning_until(self, now: float) -> float:
        """The latest moment a session expected back should arrive by (`now` if none is)."""
        cap = self._return_cap()
        until = now
        for key, away in list(self._away.items()):
            if now - away.left_at > STALE_S:  # cancelled mid-round, never released: not coming back
                del self._away[key]
            elif away.gap_s is not None and away.gap_s <= cap:
                until = max(until, min(away.left_at + 2 * away.gap_s, now + cap))
        return until

    def _take(self) -> list[_Pending]:
        """Wait for work, then for the sessions that will soon have a step; take a batch (empty once
        closed with nothing pending)."""
        with self._cond:
            while self._running or (not self._pending and not self._closed):
                self._cond.wait()
            if not self._pending:
                return []
            began = time.monotonic()
            while True:
                now = time.monotonic()
                until = self._returning_until(now)
                if len(self._pending) < self._active:
                    until = max(until, max(began, self._entered_at) + self.max_wait_s)
                if until <= now or self._closed:
                    break
                self._cond.wait(until - now)
            batch, tokens = [], 0
            for pending in self._pending:
                if batch and tokens + len(pending.step.tokens) > self.max_tokens:
                    break
                batch.append(pending)
                tokens += len(pending.step.tokens)
            del self._pending[:len(batch)]
            self._running = True
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            self._pass(batch)
            for pending in batch:
                pending.done.set()
            del batch, pending  # a step holds its session's cache: the idle worker keeps no ended session's slot

    def _run(self, batch: list[_Pending]) -> None:
        """One shared pass. If it fails, each step runs alone, so an error reaches only the step
        that caused it (a failed pass advances no cache: lengths move only at its end)."""
        began = time.monotonic()
        try:
            # On CUDA the pass is queued, not done, and the worker does not wait for it: the sessions' own host
            # work (sampling, replies) then overlaps the device's. Waiting here made 8 users 30% slower on an
            # H200 (647 against 928 tok/s). So there a step's pass seconds are its launch; the return wait reads
            # the device's time from events (`_pass_seconds`), and the start-up profile has it too.
            results = self.runner.forward([p.step for p in batch])
        except BaseException as error:  # noqa: BLE001 - handed to the callers, who raise it
            if len(batch) > 1:
                for pending in batch:
                    self._run([pending])
                return
            batch[0].error = error
        else:
            rows, tokens, seconds = len(batch), sum(len(p.step.tokens) for p in batch), time.monotonic() - began
            for pending, logits in zip(batch, results):
                pending.logits = logits
                pending.shape = PassShape(rows, tokens, seconds, max(began - pending.submitted, 0.0))
        self.forwards += 1
        self.steps += len(batch)


class _Participation:
    def __init__(self, batcher: StepBatcher, key: Hashable | None):
        self.batcher, self.key = batcher, key
        self.gap_s: float | None = None

    def __enter__(self):
        batcher = self.batcher
        with batcher._cond:
            batcher._active += 1
            batcher._entered_at = time.monotonic()
            if self.key is not None:
                batcher._in_round.add(self.key)
            away = batcher._away.pop(self.key, None)
            if away is not None:
                self.gap_s = expected_gap(batcher._entered_at - away.left_at, away.gap_s, batcher._return_cap())
            batcher._wake_if_ready()

    def __exit__(self, *exc):
        batcher = self.batcher
        with batcher._cond:
            batcher._active -= 1
            if self.key is not None:
                batcher._in_round.discard(self.key)
                if self.key in batcher._forgotten:  # released during the round (a cancelled stream)
                    batcher._forgotten.discard(self.key)
                else:
                    batcher._away[self.key] = _Away(time.monotonic(), self.gap_s)
            batcher._wake_if_ready()
