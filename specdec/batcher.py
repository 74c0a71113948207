"""Batches the forward steps of concurrent sessions into shared forward passes.

Each session's round (a draft step, a verify block, a prefill chunk) calls `forward(step)` and
blocks. One worker thread runs `ModelRunner.forward` over every step pending at that moment, so
sessions that compute at the same time share the weight traffic of one pass. Because the runner's
kernels and attention are row-invariant, a step's logits are the same bits whether it ran alone or
in a batch: batching changes speed, never output.

The worker waits up to `max_wait_s` for sessions that are inside a round but have no step pending
yet, so that steps in lockstep (drafting sessions) meet in one pass; a lone session never waits.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from specdec.runner import ModelRunner, Step


@dataclass
class _Pending:
    step: Step
    done: threading.Event = field(default_factory=threading.Event)
    logits: torch.Tensor | None = None
    error: BaseException | None = None


class StepBatcher:
    def __init__(self, runner: ModelRunner, max_wait_s: float = 0.002, max_tokens: int = 1024):
        self.runner, self.max_wait_s, self.max_tokens = runner, max_wait_s, max_tokens
        self._pending: list[_Pending] = []
        self._active = 0  # sessions inside a round (see `round`)
        self._cond = threading.Condition()
        self.forwards = 0  # forward passes run
        self.steps = 0  # steps they served
        threading.Thread(target=self._work, daemon=True, name="step-batcher").start()

    def round(self) -> "_Round":
        """Context manager around one session's round: its steps may be waited for."""
        return _Round(self)

    def forward(self, step: Step) -> torch.Tensor:
        """Run `step` (in a shared pass); returns its logits [step.logits, V]. Blocks until done."""
        pending = _Pending(step)
        with self._cond:
            self._pending.append(pending)
            self._cond.notify_all()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.logits

    def _take(self) -> list[_Pending]:
        """Wait for work, then for the active sessions' steps (up to max_wait_s); take a batch."""
        with self._cond:
            while not self._pending:
                self._cond.wait()
            deadline = time.monotonic() + self.max_wait_s
            while len(self._pending) < self._active and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            batch, tokens = [], 0
            for pending in self._pending:
                if batch and tokens + len(pending.step.tokens) > self.max_tokens:
                    break
                batch.append(pending)
                tokens += len(pending.step.tokens)
            del self._pending[:len(batch)]
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            try:
                results = self.runner.forward([p.step for p in batch])
            except BaseException as error:  # noqa: BLE001 - handed to the callers, who raise it
                for pending in batch:
                    pending.error = error
            else:
                for pending, logits in zip(batch, results):
                    pending.logits = logits
            self.forwards += 1
            self.steps += len(batch)
            for pending in batch:
                pending.done.set()


class _Round:
    def __init__(self, batcher: StepBatcher):
        self.batcher = batcher

    def __enter__(self):
        with self.batcher._cond:
            self.batcher._active += 1

    def __exit__(self, *exc):
        with self.batcher._cond:
            self.batcher._active -= 1
            self.batcher._cond.notify_all()
