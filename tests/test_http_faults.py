"""Bad input, hang-ups, capacity, health, a standalone gateway's auth and deadline, and a dead target, through
the OpenAI-compatible HTTP API of a real `specdec serve --http-port` on loopback: every client mistake a 4xx in
OpenAI's shape, every fault a clear status, and every session freed."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import openai
import pytest
from conftest import start_gateway, wait_until
from test_http_api import MESSAGES, MODEL, PROMPT, TOOLS

from specdec.weights.sources import build_byte_tokenizer

TOKEN = "http-test-token"


@pytest.fixture(scope="module")
def gateway(serve, tmp_path_factory):
    """A standalone `python -m specdec.http` in front of the same orchestrator: with a bearer token, a
    0.1 s deadline, and a tokenizer without a chat template."""
    folder = tmp_path_factory.mktemp("gateway")
    tokenizer = build_byte_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(folder / "tokenizer")
    (folder / "token").write_text(TOKEN + "\n")
    proc, base_url = start_gateway(serve.grpc, "--auth-token-file", str(folder / "token"), "--http-timeout", "0.1",
                                   "--tokenizer", str(folder / "tokenizer"))
    yield base_url
    proc.terminate()
    proc.wait(30)


@pytest.mark.parametrize("path,body,status,message", [
    ("/completions", {"prompt": "x", "n": 9}, 400, "n must be in [1, 8]"),
    ("/completions", {"prompt": "x", "guided_regex": "[0-"}, 400, "invalid regex"),
    ("/completions", {"prompt": "x", "guided_regex": "a", "guided_grammar": "start: \"a\""}, 400, "at most one"),
    ("/completions", {"prompt": "x", "guided_json": {}, "guided_choice": ["a"]}, 400,
     "at most one structured-output constraint, got guided_json and guided_choice"),
    ("/completions", {"prompt": "x", "guided_choice": []}, 400, "invalid choice: give at least one option"),
    ("/completions", {"prompt": "x", "guided_choice": "yes"}, 400, "guided_choice"),
    ("/completions", {"prompt": "x", "guided_json": "{oops"}, 400, "guided_json must be a JSON schema"),
    ("/completions", {"prompt": "x", "guided_json": "[1]"}, 400, "guided_json must be a JSON schema (an object)"),
    ("/completions", {"prompt": "x", "structured_outputs": {"regex": "a", "json_object": True}}, 400,
     "got structured_outputs.regex and structured_outputs.json_object"),
    ("/completions", {"prompt": "x", "structured_outputs": {"structural_tag": "{}"}}, 400, "invalid structural tag"),
    ("/completions", {"prompt": "x", "response_format": {"type": "structural_tag", "triggers": ["<a"], "structures": [
        {"begin": "<b>", "schema": {}, "end": ""}]}}, 400, "no trigger begins '<b>'"),
    ("/completions", {"prompt": "x", "structured_outputs": "json"}, 400, "structured_outputs"),
    ("/completions", {"prompt": "x", "prediction": {"type": "file", "content": "x"}}, 400, "prediction"),
    ("/chat/completions", {"messages": MESSAGES, "prediction": {"type": "content", "content": [{"type": "image"}]}},
     400, "prediction content parts must be text"),
    ("/chat/completions", {"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, 400, "invalid json schema"),
    ("/completions", {"prompt": "x", "logit_bias": {"100000": 1.0}}, 400, "outside the vocabulary"),
    ("/completions", {"prompt": "x", "logit_bias": {"a": 1.0}}, 400, "token ids"),
    ("/completions", {"prompt": "x", "logit_bias": {"5": 300.0}}, 400, "[-100, 100]"),
    ("/completions", {"prompt": "x", "presence_penalty": 3.0}, 400, "presence_penalty"),
    ("/completions", {"prompt": "x", "repetition_penalty": 0.0}, 400, "repetition_penalty"),
    ("/completions", {"prompt": "x", "cache_salt": "s" * 257}, 400, "cache_salt"),
    ("/completions", {"prompt": "x", "max_tokens": 0}, 400, "0 only with echo"),
    ("/completions", {"prompt": "x", "echo": True, "suffix": "y"}, 400, "echo cannot be combined with suffix"),
    ("/completions", {"prompt": "x", "suffix": "y"}, 400, "no fill-in-the-middle tokens"),
    ("/completions", {"prompt": [5, 6], "suffix": "y"}, 400, "suffix needs the prompt as one string"),
    ("/completions", {"prompt": []}, 400, "prompt must be a string or a non-empty list of token ids, or a list of"),
    ("/completions", {"prompt": 5}, 400, "prompt must be a string or a non-empty list of token ids, or a list of"),
    ("/completions", {"prompt": [True, 2]}, 400, "prompt[0] must be a token id (an integer), got true"),
    ("/completions", {"prompt": [5, "6"]}, 400, 'prompt[1] must be a token id (an integer), got "6"'),
    ("/completions", {"prompt": [[5, 6], [7, 8.0]]}, 400, "prompt[1][1] must be a token id (an integer), got 8.0"),
    ("/completions", {"prompt": ["a", 3]}, 400, "prompt[1] must be a string or a non-empty list of token ids"),
    ("/completions", {"prompt": "x", "stop_token_ids": [False]}, 400, "stop_token_ids.0"),
    ("/completions", {"prompt": "x", "stop": 5}, 400, "stop must be a string or an array of strings"),
    ("/completions", {"prompt": "x", "guided_json": 5}, 400, "guided_json must be an object or a string"),
    ("/completions", {"prompt": ["a"] * 2049}, 400, "at most 2048 prompts"),
    ("/completions", {"prompt": ["a", "b"], "suffix": "y"}, 400, "suffix needs the prompt as one string"),
    ("/completions", {"prompt": [[5, 6], [7, 10**6]]}, 400, "outside the vocabulary"),
    ("/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/completions", {"prompt": "x", "max_tokens": 5000}, 400,
     "max_tokens is too large: 5000; this server generates at most 1024 tokens a reply"),
    ("/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 5000}, 400,
     "max_completion_tokens is too large: 5000"),
    ("/completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("/completions", {"prompt": [-3, 5]}, 400, "outside the vocabulary"),
    ("/completions", {"prompt": "x" * 600}, 400, "context"),
    ("/completions", {"prompt": [2**40]}, 400, "32-bit"),
    ("/completions", {"prompt": "x", "top_k": 2**40}, 400, "top_k"),
    ("/completions", {"prompt": "x", "gamma": 2**40}, 400, "gamma"),
    ("/completions", {"prompt": "x", "gamma": 99}, 400, "gamma must be in [0, 6]"),
    ("/completions", {"prompt": "x", "proposer": "oracle"}, 400, "proposer"),
    ("/completions", {"prompt": "x", "stop": [str(i) for i in range(17)]}, 400, "at most 16 stop strings"),
    ("/completions", {"prompt": "x", "seed": -1}, 400, "seed"),
    ("/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/chat/completions", {"messages": []}, 400, "messages"),
    ("/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, 400, "top_logprobs needs logprobs"),
    ("/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools[0] must be"),
    ("/chat/completions", {"messages": MESSAGES, "functions": [{"name": "f"}]}, 400, "use tools"),
    ("/chat/completions", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "launch"}}}, 400, "not among the tools"),
    ("/chat/completions", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
                           "response_format": {"type": "json_object"}}, 400, "cannot be combined"),
    ("/chat/completions", {"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "now", "arguments": "{oops"}}]}]}, 400, "not JSON"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text content"),
    ("/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/completions", {"prompt": "x", "model": "gpt-4o"}, 404, "does not exist"),
    ("/nowhere", {}, 404, "Not Found"),
])
def test_bad_requests_get_their_4xx_in_openais_shape(serve, path, body, status, message):
    reply = httpx.post(serve.base_url + path, json={"model": MODEL, **body}, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["type"]


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "n": 9}, "n"),  # each refused by the orchestrator, not by the HTTP schema
    ({"prompt": [[5, 6], [7, 10**6]]}, "prompt"),
    ({"prompt": "x", "logit_bias": {"100000": 1.0}}, "logit_bias"),
    ({"prompt": "x", "gamma": 99}, "gamma"),
    ({"prompt": "x", "stop_token_ids": [10**6]}, "stop_token_ids"),
])
def test_a_field_the_orchestrator_refuses_is_named_as_the_client_named_it(serve, body, param):
    for stream in (False, True):  # a refused stream answers before any event
        reply = httpx.post(serve.base_url + "/completions", json={"model": MODEL, **body, "stream": stream}, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_malformed_and_oversized_bodies(serve):
    reply = httpx.post(serve.base_url + "/completions", content=b"{not json", timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    huge = json.dumps({"model": MODEL, "prompt": "x" * (5 << 20)}).encode()
    reply = httpx.post(serve.base_url + "/completions", content=huge, timeout=30)
    assert reply.status_code == 413 and "over the limit" in reply.json()["error"]["message"]

    def chunked():  # no Content-Length: the limit is counted as the body arrives
        for _ in range(6):
            yield b"x" * (1 << 20)
    reply = httpx.post(serve.base_url + "/completions", content=chunked(), timeout=30)
    assert reply.status_code == 413


def test_a_refused_stream_gets_its_status_before_any_event(serve):
    with pytest.raises(openai.BadRequestError):
        list(serve.client().completions.create(model=MODEL, prompt="x", max_tokens=5000, stream=True))


@pytest.mark.parametrize("prompts", [1, 3], ids=["one-prompt", "three-prompts"])
def test_a_disconnect_mid_stream_frees_the_sessions_everywhere(serve, prompts):
    """Of one prompt, or of a batch whose third prompt waits for a free generation: every session is freed."""
    assert serve.wait_idle() == (0, 0)
    prompt = PROMPT if prompts == 1 else [PROMPT, PROMPT + " ", PROMPT + "  "]
    with httpx.stream("POST", serve.base_url + "/completions", timeout=30,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 1000, "temperature": 0, "gamma": 3,
                            "proposer": "model", "stream": True}) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: ")
        running = min(prompts, 2)  # the server runs two generations at once
        wait_until(lambda: serve.live() == (running, running), 10, f"{running} generations on both services")
    # the client went away after one event, ~500 tokens before the end
    assert serve.wait_idle() == (0, 0)


def test_a_disconnect_before_a_plain_reply_cancels_it(serve):
    """Not streamed: the client hangs up once its ~1000-token generation is running; the gateway
    notices (answering 499 to nobody, counted in its metrics) and the sessions are freed."""
    def cancelled() -> float:
        text = httpx.get(serve.base_url.removesuffix("/v1") + "/metrics", timeout=5).text
        found = re.search(r'http_requests_total\{[^}]*route="/v1/completions",status="499"\} ([0-9.]+)', text)
        return float(found.group(1)) if found else 0.0

    assert serve.wait_idle() == (0, 0)
    before = cancelled()
    url = httpx.URL(serve.base_url)
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 1000, "temperature": 0, "gamma": 3}).encode()
    head = (f"POST {url.path}/completions HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((url.host, url.port)) as conn:
        conn.sendall(head + body)
        wait_until(lambda: serve.live()[0] > 0, 30, "the generation to start on the target")
    assert serve.wait_idle() == (0, 0)
    wait_until(lambda: cancelled() == before + 1, 10, "the gateway to count the disconnect as a 499")


def test_at_capacity_a_request_gets_429(serve):
    """The orchestrator admits 2 generations (--max-concurrent 2); a third is refused at once. Two
    ~500-token generations hold the slots; the third is sent as soon as both have begun (tried again
    should both have ended first, which would take a machine hundreds of times faster)."""
    def hold(ready: threading.Event, release: threading.Event):
        with httpx.stream("POST", serve.base_url + "/completions", timeout=60,
                          json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1000, "temperature": 0,
                                "stream": True}) as reply:
            lines = reply.iter_lines()  # held: dropping the iterator would close the response
            next(lines)
            ready.set()
            release.wait(30)

    def attempt() -> bool:
        release, ready = threading.Event(), [threading.Event(), threading.Event()]
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(hold, r, release) for r in ready]
            try:
                assert all(r.wait(30) for r in ready)
                serve.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
                return False
            except openai.RateLimitError as exc:
                assert "capacity" in exc.message
                return True
            finally:
                release.set()
                for future in held:
                    future.result()

    assert any(attempt() for _ in range(3))


def test_health_and_metrics(serve):
    assert httpx.get(serve.base_url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
    serve.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"gamma": 3})
    text = httpx.get(serve.base_url.removesuffix("/v1") + "/metrics", timeout=5).text
    assert re.search(r'http_requests_total\{[^}]*route="/v1/completions",status="200"\} [1-9]', text)
    assert "spec_decode_num_draft_tokens_total" in text


def test_standalone_gateway_auth_deadline_and_missing_template(gateway):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway, api_key="wrong", max_retries=0).models.list()
    assert httpx.post(gateway + "/completions", json={"model": MODEL, "prompt": "x"}, timeout=5).status_code == 401
    client = openai.OpenAI(base_url=gateway, api_key=TOKEN, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.APIStatusError) as caught:  # 500 tokens cannot finish within the 0.1 s deadline
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1000, temperature=0)
    assert caught.value.status_code == 504
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert httpx.get(gateway.removesuffix("/v1") + "/health", timeout=5).status_code == 200


def _children(pid: int, module: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmdline = open(f"/proc/{entry}/cmdline").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and module in cmdline:
                found.append(int(entry))
    return found


def test_zz_health_is_503_once_the_target_is_gone(serve):
    """Last in this module: it kills the target. The orchestrator's health follows its target, and
    /health follows the orchestrator's answer."""
    base = serve.base_url.removesuffix("/v1")
    assert httpx.get(base + "/health", timeout=5).status_code == 200
    (target,) = _children(serve.proc.pid, "target_service")
    os.kill(target, 9)
    deadline = time.monotonic() + 20
    while (status := httpx.get(base + "/health", timeout=5).status_code) == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status == 503
    reply = httpx.get(base + "/health", timeout=5)
    # The orchestrator answered NOT_SERVING itself: the 503 waited on no timeout.
    assert (reply.status_code, reply.json()) == (503, {"status": "unavailable", "orchestrator": "NOT_SERVING"})
    with pytest.raises(openai.APIStatusError) as caught:
        serve.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert caught.value.status_code in (503, 504)
