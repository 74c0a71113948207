"""Several prompts in one completions request (OpenAI's `prompt` as a list), read as one `Generate` call.

Each prompt is its own generation. Their messages come back interleaved as they arrive, each with its
choice renumbered prompt index · n + choice, which is how OpenAI numbers a batch's choices. At most
`parallel` generations run at once, the next prompt starting as one ends, so that one request does
not take every session the orchestrator allows. An error in any prompt's call is raised by `read`,
and `cancel` cancels every call still running.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc

from protos import specdec_pb2 as pb

MAX_PARALLEL = 4  # a batch's generations running at once (fewer where the orchestrator allows fewer)


class PromptBatch:
    """`start(request)` begins one Generate call (a grpc.aio stream); `requests`: one per prompt, each with n
    choices. Reads like a call: `await read()` gives the next message, or grpc.aio.EOF after the last."""

    def __init__(self, start: Callable[[pb.GenerateRequest], object], requests: list[pb.GenerateRequest],
                 n: int, parallel: int):
        self._start, self._n = start, n
        self._queue: asyncio.Queue = asyncio.Queue()
        self._slots = asyncio.Semaphore(max(1, parallel))
        self._calls: set = set()
        self._tasks = [asyncio.ensure_future(self._pump(index, request)) for index, request in enumerate(requests)]
        self._running = len(self._tasks)

    async def _pump(self, index: int, request: pb.GenerateRequest) -> None:
        async with self._slots:
            call = None
            try:
                call = self._start(request)
                self._calls.add(call)
                while (message := await call.read()) is not grpc.aio.EOF:
                    message.choice += index * self._n
                    self._queue.put_nowait(message)
            except Exception as exc:  # noqa: BLE001 - handed to the reader
                self._queue.put_nowait(exc)
            finally:
                self._calls.discard(call)
                self._queue.put_nowait(None)

    async def read(self):
        while self._running:
            item = await self._queue.get()
            if item is None:
                self._running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                return item
        return grpc.aio.EOF

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        for call in list(self._calls):
            call.cancel()


def parallel_for(max_sessions: int, n: int) -> int:
    """How many of a batch's prompts run at once: MAX_PARALLEL, or what `max_sessions` generations hold at n
    choices each (at least one)."""
    return max(1, min(MAX_PARALLEL, (max_sessions or MAX_PARALLEL * n) // n))
