"""The Responses API (`/v1/responses`): its translation onto chat messages and its store, directly; then
through the official `openai` client against a real `specdec serve --http-port` on loopback, each reply
checked against the chat completion of the same conversation."""

from __future__ import annotations

import json
import re

import httpx2 as httpx
import openai
import pytest
from conftest import TINY_TARGET
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from protos import specdec_pb2 as pb
from specdec.http.guard import route_of
from specdec.http.response_reply import ResponseReply, ResponseStream
from specdec.http.response_store import ResponseNotFound, ResponseNotReady, ResponseStore
from specdec.http.responses import TokenText
from specdec.http.responses_api import ResponsesRequest, chat_messages
from specdec.http.errors import BadRequest
from specdec.http.tool_calls import read_tools
from specdec.weights.sources import build_byte_tokenizer

MODEL = TINY_TARGET
ASK = [{"role": "user", "content": "fib in Python"}]
WEATHER = {"type": "function", "name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]}}, "required": ["city"],
    "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
SCHEMA = {"type": "object", "properties": {"name": {"enum": ["ada", "bob"]}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}


# -- the translation and the store, directly -----------------------------------------
def test_input_items_become_the_chat_messages_a_client_would_send():
    call = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Oslo"}'}
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Oslo"},
                                                              {"type": "input_text", "text": "?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
             call, {**call, "call_id": "call_2", "arguments": "{}", "name": "now"},
             {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"},
             {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
             call]
    chat_call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    assert chat_messages(items) == [
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            chat_call, {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        {"role": "assistant", "content": "", "tool_calls": [chat_call]}]


@pytest.mark.parametrize("body,message", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "only text parts"),
    ({"input": [{"role": "robot", "content": "x"}]}, "role must be"),
    ({"input": [{"type": "web_search_call"}]}, "'web_search_call' are not supported"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "call_id, name and arguments"),
    ({"input": ["text"]}, "must be an object"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
    ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice must be"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "needs its schema"),
])
def test_items_and_tools_that_cannot_be_served_are_refused_with_the_reason(body, message):
    request = ResponsesRequest.model_validate({"model": MODEL, **body})
    with pytest.raises(BadRequest, match=message):
        request.chat_request([])


def test_truncation_auto_drops_the_fewest_oldest_messages_that_make_it_fit():
    """A stand-in renderer (a token per character and 4 a message): the fewest oldest messages go, a tool's output
    whose call went goes too, the instructions and the last message stay; without "auto", nothing goes; a last
    message that cannot fit is a 400 naming the input."""
    def render(chat) -> list[int]:
        return [0] * sum(4 + len(m.content or "") for m in chat.messages)

    conversation = [{"role": "user", "content": "a" * 40}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "b" * 40}, {"role": "assistant", "content": "c" * 20}]
    body = {"model": MODEL, "input": "d" * 20, "instructions": "sys", "max_output_tokens": 10}
    auto = ResponsesRequest.model_validate({**body, "truncation": "auto"})
    chat, prompt = auto.fitted(conversation, render, 100)  # all: 7 + 44 + 4 + 44 + 24 + 24 = 147 tokens
    kept = [(m.role, m.content) for m in chat.messages]
    assert kept == [("system", "sys"), ("assistant", "c" * 20), ("user", "d" * 20)], "the tool output went with its call"
    assert len(prompt) + 10 <= 100
    chat, prompt = auto.fitted(conversation, render, 200)
    assert len(chat.messages) == 6 and len(prompt) == 147, "it fits: nothing dropped"
    plain = ResponsesRequest.model_validate(body)
    assert len(plain.fitted(conversation, render, 100)[0].messages) == 6, "truncation disabled: nothing dropped"
    with pytest.raises(BadRequest, match="exceeds the context of 40") as refused:
        auto.fitted(conversation, render, 40)
    assert refused.value.param == "input"


def test_the_chat_request_carries_the_settings_and_the_extensions():
    request = ResponsesRequest.model_validate({
        "model": MODEL, "input": "hi", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5,
        "top_p": 0.9, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "weather"},
        "parallel_tool_calls": False, "seed": 3, "gamma": 2, "cache_salt": "t", "unknown": 1})
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    chat = request.chat_request(history)
    assert [m.for_template() for m in chat.messages] == [{"role": "system", "content": "Be brief."}, *history,
                                                         {"role": "user", "content": "hi"}]
    assert (chat.max_new_tokens(), chat.temperature, chat.top_p, chat.seed, chat.gamma, chat.cache_salt) == \
        (9, 0.5, 0.9, 3, 2, "t")
    assert list(chat.offered_tools()) == ["weather"] and chat.constraint()[0] == "lark"
    schema = ResponsesRequest.model_validate({"model": MODEL, "input": "x", "text": {"format": {
        "type": "json_schema", "name": "p", "schema": SCHEMA, "strict": True}}}).chat_request([])
    assert schema.constraint() == ("json_schema", json.dumps(SCHEMA))


def test_the_store_keeps_chains_and_drops_the_least_recently_used_past_its_budget():
    def part(n: int) -> list[dict]:
        return [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]

    size = len(json.dumps({"id": "r1"})) + len(json.dumps(part(1))) + len("[]")  # every entry below is this size
    store = ResponseStore(budget_bytes=4 * size)
    store.put("r1", {"id": "r1"}, part(1), None)
    store.put("r2", {"id": "r2"}, part(2), "r1")
    store.put("ot", {"id": "ot"}, part(9), None)
    assert store.conversation("r2") == [*part(1), *part(2)] and store.body("r2") == {"id": "r2"}
    store.put("x1", {"id": "x1"}, part(3), None)
    assert len(store) == 4
    store.put("x2", {"id": "x2"}, part(4), None)  # over the budget: "ot" was used least recently
    with pytest.raises(ResponseNotFound):
        store.body("ot")
    assert store.conversation("r2") == [*part(1), *part(2)] and len(store) == 4
    store.delete("r1")
    with pytest.raises(ResponseNotFound):  # a chain with a link gone cannot be read
        store.conversation("r2")
    with pytest.raises(ResponseNotFound):
        store.delete("r1")
    assert not store.put("big", {"id": "big", "pad": "x" * 4 * size}, [], None) and len(store) == 3
    assert not ResponseStore(0).enabled


def test_a_route_with_a_parameter_is_counted_under_its_template():
    routes = frozenset({"/v1/responses", "/v1/responses/{response_id}", "/v1/models/{model:path}",
                        "/v1/responses/{response_id}/input_items"})
    assert route_of("/v1/responses", routes) == "/v1/responses"
    assert route_of("/v1/responses/resp_1", routes) == "/v1/responses/{response_id}"
    assert route_of("/v1/responses/resp_1/input_items", routes) == "/v1/responses/{response_id}/input_items"
    assert route_of("/v1/responses/resp_1/other", routes) == "other"
    assert route_of("/v1/models/a/b", routes) == "/v1/models/{model:path}"
    assert route_of("/v1/models/", routes) == "other" and route_of("/x", routes) == "other"


def test_a_streamed_reply_of_text_then_calls_is_a_message_then_function_call_items():
    """Text, then two calls in the <tool_call> format, streamed a few characters at a time: the text goes out as
    deltas while the calls are held; at the end the message closes and each call is an item of its own with its
    arguments, in OpenAI's order, and the official SDK's stream state accumulates them into the final response."""
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "hi", "tools": [WEATHER], "store": False})
    reply = ResponseReply(request, MODEL, TokenText(build_byte_tokenizer()), read_tools([CHAT_WEATHER]))
    text = ('Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    stream = ResponseStream(reply)
    events = stream.start()
    for at in range(0, len(text), 5):
        if out := reply.stream_text(text[at:at + 5]):
            events += stream.delta(out, None)
    reply.stats[0] = pb.GenerationStats(finish_reason=pb.FINISH_REASON_STOP, prompt_tokens=3, generated_tokens=40)
    events += stream.finish()
    kinds = [e["type"] for e in events]
    first_call = kinds.index("response.output_text.done")
    assert kinds[first_call:] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done", *["response.output_item.added",
                                  "response.function_call_arguments.delta", "response.function_call_arguments.done",
                                  "response.output_item.done"] * 2, "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    state = ResponseStreamState(input_tools=[WEATHER], text_format=openai.NOT_GIVEN)
    for event in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=event))
    final = state._completed_response
    assert final.output_text == "Let me look.\n" and [o.type for o in final.output] == ["message", "function_call",
                                                                                       "function_call"]
    assert [json.loads(o.arguments)["city"] for o in final.output[1:]] == ["Oslo", "Rome"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]


# -- through the server --------------------------------------------------------------
def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def events_of(stream) -> list:
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    return events


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_reply_is_the_chat_completions_reply_under_speculation(serve, stream):
    """Greedy, γ = 3 with the draft model: the output text is target-only's chat reply to the same messages, the
    usage its usage, the status incomplete at max_output_tokens; streamed, the deltas make up that text and the
    events come in OpenAI's order with consecutive sequence numbers."""
    client = serve.client()
    want = chat(client, ASK, max_tokens=24, extra_body={"gamma": 0})
    args = dict(model=MODEL, input="fib in Python", max_output_tokens=24, temperature=0,
                extra_body={"gamma": 3, "proposer": "model"})
    if not stream:
        reply = client.responses.create(**args)
    else:
        events = events_of(client.responses.create(stream=True, **args))
        assert [e.type for e in events[2:4]] == ["response.output_item.added", "response.content_part.added"]
        assert [e.type for e in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                                 "response.output_item.done", "response.incomplete"]
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == events[-4].text == want.choices[0].message.content
        reply = events[-1].response
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == want.choices[0].message.content and reply.output[0].role == "assistant"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (want.usage.prompt_tokens, 24)
    speculation = reply.usage.model_extra["speculation"]
    assert 0 < speculation["drafted"] and speculation["accepted"] <= speculation["drafted"]


def test_the_store_cancels_only_a_running_response_and_chains_go_on_only_from_ended_ones():
    store = ResponseStore(budget_bytes=1 << 20)
    for response_id, status in [("run", "in_progress"), ("done", "completed"), ("cut", "incomplete")]:
        store.put(response_id, {"id": response_id, "status": status}, [{"role": "user", "content": response_id}], None)
    assert store.cancel("run") == {"id": "run", "status": "cancelled"} == store.body("run")
    assert store.cancel("done")["status"] == "completed" and store.cancel("run")["status"] == "cancelled"
    assert store.conversation("cut") == [{"role": "user", "content": "cut"}]
    with pytest.raises(ResponseNotReady):
        store.conversation("run")
    with pytest.raises(ResponseNotFound):
        store.cancel("none")


def test_previous_response_id_goes_on_with_the_stored_conversation(serve):
    """A second turn after `previous_response_id` (its instructions sent again, as clients do): its prompt is the
    chat template's rendering of the whole conversation, its reply the chat reply to it, and the first turn's
    cache serves most of its prompt (a salt of this test's own, so only its turns share). A third turn without
    instructions goes on from the second, the earlier instructions not carried over."""
    client = serve.client()
    args = dict(model=MODEL, temperature=0, extra_body={"cache_salt": "previous-response-test"})
    system = {"role": "system", "content": "You write code."}
    first = client.responses.create(input="fib in Python", instructions=system["content"], max_output_tokens=12,
                                    **args)
    second = client.responses.create(input="and in C?", instructions=system["content"], previous_response_id=first.id,
                                     max_output_tokens=12, **args)
    history = [*ASK, {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "and in C?"}]
    want = chat(client, [system, *history], max_tokens=12)
    assert second.output_text == want.choices[0].message.content
    assert second.usage.input_tokens == want.usage.prompt_tokens
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2
    third = client.responses.create(input="thanks", previous_response_id=second.id, max_output_tokens=4, **args)
    longer = [*history, {"role": "assistant", "content": second.output_text}, {"role": "user", "content": "thanks"}]
    assert third.usage.input_tokens == chat(client, longer, max_tokens=1).usage.prompt_tokens
    assert client.responses.retrieve(second.id).output_text == second.output_text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_call_is_a_function_call_item_and_its_output_goes_on(serve, stream):
    """A named tool_choice: one function_call item whose arguments follow the parameters, no message, as the chat
    API's call (γ = 3 against target-only); the tool's answer given as function_call_output after
    previous_response_id renders as the chat API's tool message."""
    client = serve.client()
    args = dict(model=MODEL, input="weather in Oslo?", tools=[WEATHER], temperature=0, max_output_tokens=100,
                tool_choice={"type": "function", "name": "weather"}, extra_body={"gamma": 3, "proposer": "model"})
    if stream:
        events = events_of(client.responses.create(stream=True, **args))
        assert [e.type for e in events[2:]] == [
            "response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
        reply = events[-1].response
    else:
        reply = client.responses.create(**args)
    want = chat(client, [{"role": "user", "content": "weather in Oslo?"}], tools=[CHAT_WEATHER], max_tokens=100,
                tool_choice={"type": "function", "function": {"name": "weather"}}, extra_body={"gamma": 0})
    (call,) = reply.output
    (chat_call,) = want.choices[0].message.tool_calls
    assert reply.status == "completed" and call.type == "function_call" and call.name == "weather"
    assert call.arguments == chat_call.function.arguments and json.loads(call.arguments)["city"] in ("Rome", "Oslo")
    answered = client.responses.create(
        model=MODEL, previous_response_id=reply.id, tools=[WEATHER], max_output_tokens=1, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "-3 C"}])
    history = [{"role": "user", "content": "weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [chat_call.model_dump()]},
               {"role": "tool", "tool_call_id": chat_call.id, "content": "-3 C"}]
    assert answered.usage.input_tokens == chat(client, history, tools=[CHAT_WEATHER], max_tokens=1).usage.prompt_tokens


def test_a_json_schema_format_and_logprobs(serve):
    """text.format json_schema: the text parses and follows the schema (γ = 3 as target-only), as guided_choice
    does its options; the output text's
    log-probabilities (include) are the chat API's, whole and streamed."""
    client = serve.client()
    form = {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}
    texts = [client.responses.create(model=MODEL, input="who?", text=form, max_output_tokens=60, temperature=0,
                                     extra_body={"gamma": g, "proposer": "model"}).output_text for g in (3, 0)]
    assert texts[0] == texts[1] and json.loads(texts[0])["name"] in ("ada", "bob")
    options = ["north", "south"]
    chosen = client.responses.create(model=MODEL, input="which way?", max_output_tokens=20, temperature=0,
                                     extra_body={"guided_choice": options, "gamma": 3}).output_text
    assert chosen in options, "vLLM's structured-output fields pass through as the chat API's"
    want = chat(client, ASK, max_tokens=10, logprobs=True, top_logprobs=3).choices[0].logprobs.content
    want = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in want]
    args = dict(model=MODEL, input="fib in Python", max_output_tokens=10, temperature=0, top_logprobs=3,
                include=["message.output_text.logprobs"], extra_body={"gamma": 3})
    whole = client.responses.create(**args).output[0].content[0].logprobs
    events = events_of(client.responses.create(stream=True, **args))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done").logprobs
    for got in (whole, streamed, done, events[-1].response.output[0].content[0].logprobs):
        assert [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in got] == want


def test_stored_responses_can_be_read_and_deleted_and_unknown_ids_are_404(serve):
    client = serve.client()
    kept = client.responses.create(model=MODEL, input="x", max_output_tokens=2, temperature=0)
    assert client.responses.retrieve(kept.id).model_dump() == kept.model_dump()
    client.responses.delete(kept.id)
    unstored = client.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    for gone in (kept.id, unstored.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
        with pytest.raises(openai.NotFoundError, match="no stored response"):
            client.responses.create(model=MODEL, input="y", previous_response_id=gone)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)
    client.responses.create(model=MODEL, input="x", max_output_tokens=2)
    gauges = httpx.get(serve.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    stored = float(re.search(r"^http_stored_responses(?:\{[^}]*\})? ([0-9.e+]+)$", gauges, re.M).group(1))
    size = float(re.search(r"^http_stored_response_bytes(?:_bytes)?(?:\{[^}]*\})? ([0-9.e+]+)$", gauges, re.M).group(1))
    assert stored >= 1 and size > 1000 * stored / 2, gauges


def test_a_stored_responses_input_items_are_listed_a_page_at_a_time(serve):
    """`client.responses.input_items.list`: the request's items with ids (kept where given), text as parts, newest
    first by default; pages of `limit` followed through `after` by the SDK; a bad order, limit or after is a 400."""
    client = serve.client()
    items = [{"role": "system", "content": "Be brief."},
             {"type": "message", "id": "msg_given", "role": "user",
              "content": [{"type": "input_text", "text": "weather in Oslo?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"}]
    reply = client.responses.create(model=MODEL, input=items, tools=[WEATHER], max_output_tokens=2, temperature=0)
    listed = list(client.responses.input_items.list(reply.id, order="asc", limit=3))
    assert [item.type for item in listed] == ["message", "message", "function_call", "function_call_output"]
    assert listed[0].content[0].text == "Be brief." and listed[1].id == "msg_given"
    assert (listed[2].call_id, listed[2].arguments, listed[3].output) == ("call_1", '{"city": "Oslo"}', "-3 C")
    assert len({item.id for item in listed}) == 4 and all(item.id for item in listed)
    newest = client.responses.input_items.list(reply.id, limit=2)
    assert [item.id for item in newest.data] == [listed[3].id, listed[2].id] and newest.has_more
    url = f"{serve.base_url}/responses/{reply.id}/input_items"
    for query, param in (("order=up", "order"), ("limit=0", "limit"), ("limit=x", "limit"), ("after=nope", "after")):
        answer = httpx.get(f"{url}?{query}", timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
    assert httpx.get(f"{serve.base_url}/responses/resp_none/input_items", timeout=30).status_code == 404


@pytest.mark.parametrize("body,param,message", [
    ({"input": "x", "background": True, "store": False}, "background", "needs store: true"),
    ({"input": "x", "include": ["nonsense"]}, "include", "unknown value"),
    ({"input": "x", "include": ["message.output_text.logprobs"], "tools": [WEATHER]}, "include", "tools"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs", "needs include"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
    ({"input": "x", "gamma": -1}, "gamma", "greater than or equal to 0"),
    ({"input": "x", "tools": [{"type": "file_search"}]}, "tools", "only function tools"),
    ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, "tools", "tools[0].name must be 1-64 letters"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input", "text parts"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "x", "max_output_tokens": 5000}, "max_output_tokens", "max_output_tokens is too large: 5000"),
])
def test_bad_requests_get_a_400_naming_the_field(serve, body, param, message):
    reply = httpx.post(serve.base_url + "/responses", json={"model": MODEL, **body}, timeout=30)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["type"] == "invalid_request_error", reply.text
    assert message in error["message"] and (param is None or error["param"] == param), error


def test_truncation_auto_fits_a_long_conversation_to_the_context(serve):
    """Forty messages of the tiny model's 512-token context: refused as they are, answered with "auto", whose
    prompt is the conversation from the first message that lets it fit with the reply's 16 tokens of room."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: " + "xy" * 12} for i in range(40)]
    args = dict(model=MODEL, input=turns, instructions="Be brief.", max_output_tokens=16, temperature=0)
    refused = httpx.post(serve.base_url + "/responses", json=args, timeout=30)
    assert refused.status_code == 400 and "context" in refused.json()["error"]["message"], refused.text
    reply = serve.client().responses.create(truncation="auto", **args)
    system = [{"role": "system", "content": "Be brief."}]
    count = lambda messages: httpx.post(serve.base_url.removesuffix("/v1") + "/tokenize", timeout=30,
                                        json={"model": MODEL, "messages": system + messages}).json()["count"]
    first = next(d for d in range(40) if count(turns[d:]) + 16 <= 512)
    assert first > 0 and count(turns[first - 1:]) + 16 > 512
    assert reply.usage.input_tokens == count(turns[first:]) and reply.truncation == "auto"


def test_a_disconnect_mid_stream_frees_the_sessions(serve):
    assert serve.wait_idle() == (0, 0)
    with httpx.stream("POST", serve.base_url + "/responses", timeout=30,
                      json={"model": MODEL, "input": "fib", "max_output_tokens": 1000, "temperature": 0,
                            "gamma": 3, "proposer": "model", "stream": True}) as reply:
        lines = reply.iter_lines()
        assert next(lines) == "event: response.created"
        target, draft = serve.live()  # the draft may still hold an earlier reply's feed, which ends after its call
        assert target == 1 and draft >= 1, "the generation should be running on both services"
    assert serve.wait_idle() == (0, 0)
