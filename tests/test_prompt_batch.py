"""`specdec.http.batch.PromptBatch`: several prompts' calls read as one, against calls made in the test."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos import specdec_pb2 as pb
from specdec.http.batch import PromptBatch, parallel_for


class FakeCall:
    """A Generate call that yields `messages` GenerateResponses (each choice of n in turn), then EOF or `error`."""

    running = 0
    most = 0

    def __init__(self, request: pb.GenerateRequest, n: int, messages: int = 2, error: Exception | None = None):
        self.prompt, self.n, self.left, self.error = request.prompt, n, messages * n, error
        self.cancelled = False
        FakeCall.running += 1
        FakeCall.most = max(FakeCall.most, FakeCall.running)

    async def read(self):
        await asyncio.sleep(0.001)
        if self.left == 0:
            FakeCall.running -= 1
            if self.error is not None:
                raise self.error
            return grpc.aio.EOF
        self.left -= 1
        return pb.GenerateResponse(text=self.prompt, choice=self.left % self.n)

    def cancel(self):
        self.cancelled = True


def read_all(batch: PromptBatch) -> list[pb.GenerateResponse]:
    async def go():
        out = []
        while (message := await batch.read()) is not grpc.aio.EOF:
            out.append(message)
        return out

    return asyncio.get_event_loop().run_until_complete(asyncio.wait_for(go(), 10))  # a lost end fails, not hangs


@pytest.fixture(autouse=True)
def loop():
    asyncio.set_event_loop(asyncio.new_event_loop())
    FakeCall.running = FakeCall.most = 0
    yield
    asyncio.get_event_loop().close()


def test_choices_are_numbered_prompt_by_prompt_and_at_most_parallel_calls_run():
    requests = [pb.GenerateRequest(prompt=f"p{i}") for i in range(5)]

    async def make():
        return PromptBatch(lambda r: FakeCall(r, n=2), requests, n=2, parallel=2)

    batch = asyncio.get_event_loop().run_until_complete(make())
    messages = read_all(batch)
    assert sorted((m.choice, m.text) for m in messages) == sorted((2 * i + c, f"p{i}") for i in range(5)
                                                                  for c in (0, 1) for _ in range(2))
    assert FakeCall.most == 2


def test_an_error_in_any_prompt_is_raised_and_a_start_that_fails_too():
    requests = [pb.GenerateRequest(prompt=f"p{i}") for i in range(3)]
    boom = ValueError("prompt 1 refused")

    def start(request):
        return FakeCall(request, n=1, error=boom if request.prompt == "p1" else None)

    async def make(starter):
        return PromptBatch(starter, requests, n=1, parallel=3)

    with pytest.raises(ValueError, match="prompt 1 refused"):
        read_all(asyncio.get_event_loop().run_until_complete(make(start)))

    def failing(request):
        raise ConnectionError("channel closed")

    with pytest.raises(ConnectionError):
        read_all(asyncio.get_event_loop().run_until_complete(make(failing)))


def test_parallel_for_respects_the_orchestrators_sessions():
    assert parallel_for(64, 1) == 4 and parallel_for(2, 1) == 2 and parallel_for(8, 8) == 1 and parallel_for(3, 4) == 1
    assert parallel_for(0, 2) == 4, "an orchestrator that reports no cap"
