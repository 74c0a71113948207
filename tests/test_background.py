"""Background responses (`background: true`, `specdec.http.background`) through the official `openai` client against
`python -m specdec.http` in front of a stack whose target is 40 ms away, a round trip a round: a long reply takes
seconds, long enough to be read, cancelled and deleted while it runs. Then two HTTP servers sharing Redis, where
the one asked to cancel or delete is not the one generating."""

from __future__ import annotations

import re
import time

import httpx2 as httpx
import openai
import pytest
from conftest import LETTERS, TINY_TARGET, redis_server, slow_target_stack, start_gateway, wait_until

from orchestrator.clients import target_client

MODEL = TINY_TARGET
SHORT = dict(model=MODEL, input="fib in Python", max_output_tokens=12, temperature=0)
MEDIUM = dict(model=MODEL, input="fib in Python", max_output_tokens=40, temperature=0,
              extra_body={"gamma": 0, "logit_bias": LETTERS})  # about 2 s
LONG = dict(model=MODEL, input="fib in Python", max_output_tokens=300, temperature=0,
            extra_body={"gamma": 0, "logit_bias": LETTERS})  # at least 12 s at 40 ms a round


@pytest.fixture(scope="module")
def slow_stack():
    with slow_target_stack() as stack:
        yield stack


@pytest.fixture(scope="module")
def client(slow_stack):
    proc, url = start_gateway(slow_stack.endpoint)
    yield openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    proc.terminate()
    proc.wait(30)


def target_sessions(stack) -> int:
    target = target_client(stack.target_address)
    try:
        return target.info().live_sessions
    finally:
        target.close()


def finished(client, response_id: str, timeout_s: float = 60.0):
    """The response once it is no longer queued or in progress (polled as a client would)."""
    seen = []
    wait_until(lambda: seen.append(client.responses.retrieve(response_id)) or seen[-1].status not in
               ("queued", "in_progress"), timeout_s, f"response {response_id} to end")
    return seen[-1]


def test_a_background_response_is_read_when_done_and_is_the_foreground_reply(client):
    started = client.responses.create(background=True, **SHORT)
    assert (started.status, started.background, started.output) == ("in_progress", True, [])
    done = finished(client, started.id)
    foreground = client.responses.create(**SHORT)
    assert done.status == foreground.status == "incomplete" and done.background and not foreground.background
    assert done.output_text == foreground.output_text and done.usage.output_tokens == foreground.usage.output_tokens == 12
    went_on = client.responses.create(previous_response_id=done.id, **{**SHORT, "input": "and in C?"})
    assert went_on.usage.input_tokens > done.usage.input_tokens + 12


def text_of(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_streamed_background_response_goes_on_without_its_client_and_is_streamed_again_from_any_event(client):
    """`stream` with `background`: the events as a foreground stream sends them; the client that leaves does not
    stop it, and `GET ?stream=true&starting_after=N` gives the events after N, first those sent, then the rest as
    they come, down to the end."""
    foreground = client.responses.create(**MEDIUM)
    whole = list(client.responses.create(background=True, stream=True, **MEDIUM))
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert whole[0].response.background and whole[-1].type == "response.incomplete"
    assert text_of(whole) == whole[-1].response.output_text == foreground.output_text
    again = list(client.responses.retrieve(whole[0].response.id, stream=True, starting_after=5))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in whole[6:]]

    stream = client.responses.create(background=True, stream=True, **MEDIUM)
    events = iter(stream)
    begun = [next(events) for _ in range(6)]  # the start, the message's opening, two deltas
    stream.close()  # the client leaves mid-way
    response_id = begun[0].response.id
    assert client.responses.retrieve(response_id).status == "in_progress"
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=begun[-1].sequence_number))
    assert rest[0].sequence_number == 6 and rest[-1].type == "response.incomplete"
    assert text_of(begun + rest) == foreground.output_text == client.responses.retrieve(response_id).output_text


def test_a_cancelled_background_response_stops_and_frees_its_sessions(client, slow_stack):
    running = client.responses.create(background=True, **LONG)
    assert client.responses.retrieve(running.id).status == "in_progress"
    with pytest.raises(openai.BadRequestError, match="is in_progress"):
        client.responses.create(previous_response_id=running.id, **SHORT)
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and cancelled.id == running.id
    wait_until(lambda: target_sessions(slow_stack) == 0, 10, "the target's session to be freed")
    time.sleep(0.5)  # what the cancelled task could still store, it would have by now
    assert client.responses.retrieve(running.id).status == "cancelled"
    assert client.responses.cancel(running.id).status == "cancelled"  # again: as it stands
    with pytest.raises(openai.BadRequestError, match="is cancelled"):
        client.responses.create(previous_response_id=running.id, **SHORT)


def background_gauge(client) -> float:
    text = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics", timeout=10).text
    return float(re.search(r"^http_background_responses(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M).group(1))


def test_deleting_a_running_background_response_stops_it(client, slow_stack):
    running = client.responses.create(background=True, **LONG)
    assert background_gauge(client) == 1
    client.responses.delete(running.id)
    wait_until(lambda: target_sessions(slow_stack) == 0, 10, "the target's session to be freed")
    time.sleep(0.5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(running.id)
    assert background_gauge(client) == 0


def test_only_background_responses_are_cancelled_or_streamed_again(client):
    foreground = client.responses.create(**SHORT)
    with pytest.raises(openai.BadRequestError, match="not a background response"):
        client.responses.cancel(foreground.id)
    with pytest.raises(openai.BadRequestError, match="not kept here"):
        list(client.responses.retrieve(foreground.id, stream=True))
    with pytest.raises(openai.BadRequestError, match="starting_after"):
        client.responses.retrieve(foreground.id, extra_query={"stream": "true", "starting_after": "x"})
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.cancel("resp_none")


def test_http_servers_sharing_redis_cancel_delete_and_fail_each_others_background_responses(slow_stack):
    """A cancel or delete on the server that is not generating reaches the one that is within its watch; a
    server that stops fails what it was generating, as the other reads."""
    with redis_server() as url:
        gateways = [start_gateway(slow_stack.endpoint, "--redis-url", url) for _ in range(2)]
        try:
            generating, other = (openai.OpenAI(base_url=at, api_key="none", max_retries=0) for _, at in gateways)
            running = generating.responses.create(background=True, **LONG)
            assert other.responses.retrieve(running.id).status == "in_progress"
            assert other.responses.cancel(running.id).status == "cancelled"
            wait_until(lambda: target_sessions(slow_stack) == 0, 10, "the generating server to cancel its call")
            assert generating.responses.retrieve(running.id).status == "cancelled"

            running = generating.responses.create(background=True, **LONG)
            other.responses.delete(running.id)
            wait_until(lambda: target_sessions(slow_stack) == 0, 10, "the generating server to stop")
            with pytest.raises(openai.NotFoundError):
                generating.responses.retrieve(running.id)

            running = generating.responses.create(background=True, **LONG)
            gateways[0][0].terminate()
            gateways[0][0].wait(30)
            failed = other.responses.retrieve(running.id)
            assert failed.status == "failed" and "stopped" in failed.error.message
            wait_until(lambda: target_sessions(slow_stack) == 0, 10, "the stopped server's call to end")
        finally:
            for proc, _ in gateways:
                proc.terminate()
                proc.wait(30)
