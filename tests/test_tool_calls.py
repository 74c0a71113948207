"""Tool calls, the pure part (`specdec.http.tool_calls`): reading tools and tool_choice, the grammar that forces
a call, and reading calls back out of a reply, whole or streamed. Through the HTTP API: tests/test_http_api.py."""

from __future__ import annotations

import json
import re

import llguidance
import llguidance.hf
import pytest

from specdec.http.tool_calls import ToolError, ToolStream, check_template, forcing_grammar, parse_calls, read_choice, read_tools
from specdec.weights.sources import CHATML, build_byte_tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now"}}
TOOLS = read_tools([WEATHER, CLOCK])


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.mark.parametrize("tools,message", [
    ([{"type": "function"}], "tools[0] must be"),
    (["get_weather"], "tools[0] must be"),
    ([{"type": "retrieval", "function": {"name": "x"}}], "tools[0] must be"),
    ([{"type": "function", "function": {"name": "no spaces"}}], "letters, digits"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "letters, digits"),
    ([WEATHER, WEATHER], "two tools are named 'get_weather'"),
    ([{"type": "function", "function": {"name": "x", "parameters": "{}"}}], "JSON schema object"),
])
def test_malformed_tools_are_refused_with_the_reason(tools, message):
    with pytest.raises(ToolError, match=re.escape(message)):
        read_tools(tools)


def test_the_responses_apis_flat_tools_read_as_the_chat_apis():
    flat = [{"type": "function", **WEATHER["function"]}, {"type": "function", "name": "now", "strict": False}]
    assert {name: tool.spec for name, tool in read_tools(flat, flat=True).items()} == \
        {"get_weather": WEATHER, "now": {"type": "function", "function": {"name": "now", "strict": False}}}
    for tools, message in (([{"type": "web_search"}], "only function tools are supported, got type 'web_search'"),
                           ([{"type": "function", "name": "a b"}], "tools[0].name must be"),
                           ([{"type": "function", "name": "x", "parameters": []}], "tools[0].parameters must be")):
        with pytest.raises(ToolError, match=re.escape(message)):
            read_tools(tools, flat=True)


def test_tool_choice():
    assert read_choice(None, TOOLS) == "auto" and read_choice(None, {}) == "none"
    assert read_choice("none", {}) == "none" and read_choice("required", TOOLS) == "required"
    assert read_choice({"type": "function", "function": {"name": "now"}}, TOOLS) == "now"
    for bad, message in [({"type": "function", "function": {"name": "later"}}, "not among the tools"),
                         ("always", "must be"), ({"function": {"name": "now"}}, "must be"), ("auto", "needs tools")]:
        with pytest.raises(ToolError, match=re.escape(message)):
            read_choice(bad, TOOLS if bad != "auto" else {})


def test_only_a_template_that_knows_tool_calls_takes_tools():
    check_template(CHATML)
    for template in (None, "", "{% for m in messages %}{{ m.content }}{% endfor %}"):
        with pytest.raises(ToolError, match="no <tool_call> format"):
            check_template(template)


def matches(grammar: str, text: str) -> bool:
    """Whether `text` (bytes tokens of the byte tokenizer) is a whole sentence of `grammar`."""
    byte_tokenizer = build_byte_tokenizer()
    tokenizer = llguidance.hf.from_tokenizer(byte_tokenizer, n_vocab=len(byte_tokenizer))
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def test_the_forcing_grammar_takes_exactly_the_calls_it_should():
    named, required = forcing_grammar(TOOLS, "get_weather", True), forcing_grammar(TOOLS, "required", False)
    parallel = forcing_grammar(TOOLS, "required", True)
    weather, clock = call("get_weather", {"city": "Oslo"}), call("now", {})
    assert matches(named, weather) and matches(required, weather) and matches(required, clock)
    assert not matches(named, clock), "a named choice takes that function only"
    assert not matches(named, call("get_weather", {"town": "Oslo"})), "arguments follow the parameters"
    assert not matches(named, call("get_weather", {"city": 3}))
    assert not matches(named, weather.replace(", ", ",")), "the layout is json.dumps's"
    assert not matches(required, weather + "\n" + clock), "one call unless parallel"
    assert matches(parallel, weather + "\n" + clock) and not matches(named, weather + "\n" + weather)


def test_calls_are_read_from_a_whole_reply():
    weather, clock = call("get_weather", {"city": "Oslo"}), call("now", {})
    content, calls = parse_calls(f"Let me look.\n{weather}\n{clock}\n", TOOLS)
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"} and calls[1]["function"]["arguments"] == "{}"
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert parse_calls(weather, TOOLS)[0] is None
    for text in ("no call here", weather[:-3], weather + " and then some text", call("launch", {}),
                 "<tool_call>\n{not json}\n</tool_call>", call("now", {}).replace('"arguments": {}', '"arguments": 3')):
        assert parse_calls(text, TOOLS) == (text, []), text


@pytest.mark.parametrize("step", [1, 3, 1000], ids=["by-character", "by-three", "whole"])
def test_a_stream_sends_content_at_once_and_holds_a_call_until_it_ends(step):
    text = "Looking <tools> up: " + call("get_weather", {"city": "Oslo"})
    stream = ToolStream(TOOLS)
    sent = "".join(stream.push(text[i:i + step]) for i in range(0, len(text), step))
    assert sent == "Looking <tools> up: "
    rest, calls = stream.finish()
    assert rest == "" and [c["function"]["name"] for c in calls] == ["get_weather"]

    stream = ToolStream(TOOLS)
    partial = "".join(stream.push(part) for part in ("plain <tool", "_ca"))
    assert partial == "plain "  # what could begin a call waits
    assert stream.push("ll-less") == "<tool_call-less" and stream.finish() == ("", []), "and goes once it cannot"

    broken = "x " + call("get_weather", {"city": "Oslo"})[:-4]
    stream = ToolStream(TOOLS)
    sent = "".join(stream.push(broken[i:i + step]) for i in range(0, len(broken), step))
    rest, calls = stream.finish()
    assert sent + rest == broken and calls == [], "a call that does not parse goes out as text, whole"


FENCED_CALL = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'  # the 1.5B coder's


def test_a_reply_that_is_only_calls_json_is_read_as_those_calls():
    """Without tags: one call's object, bare or as the reply's one ```json block (as the packaged coder writes
    it), or a list of calls; anything else about it (another tool, text beside it, other code) stays content."""
    for text in (FENCED_CALL, ' {"name": "get_weather", "arguments": {"city": "Paris"}}\n',
                 '```\n{"name": "get_weather", "arguments": {"city": "Paris"}}```'):
        content, calls = parse_calls(text, TOOLS)
        assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
            == [("get_weather", {"city": "Paris"})], text
    two = json.dumps([{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}])
    assert [c["function"]["name"] for c in parse_calls(two, TOOLS)[1]] == ["now", "get_weather"]
    for text in (FENCED_CALL.replace("get_weather", "launch"), FENCED_CALL + "\nThat is the call.",
                 "Call this:\n" + FENCED_CALL, '```python\nprint({"name": "now"})\n```', '{"name": "now", "x": 1',
                 "[]", '{"city": "Paris"}', json.dumps([{"name": "now", "arguments": {}}, {"name": "launch"}])):
        assert parse_calls(text, TOOLS) == (text, []), text


@pytest.mark.parametrize("step", [1, 4, 1000], ids=["by-character", "by-four", "whole"])
def test_a_stream_holds_a_reply_only_while_it_may_be_a_bare_call(step):
    def streamed(text: str) -> tuple[list[str], str, list[dict]]:
        stream = ToolStream(TOOLS)
        sent = [stream.push(text[i:i + step]) for i in range(0, len(text), step)]
        return sent, *stream.finish()

    sent, rest, calls = streamed(FENCED_CALL)
    assert "".join(sent) + rest == "" and [c["function"]["name"] for c in calls] == ["get_weather"]
    code = "```python\nprint(1)\n```\nThat prints 1."
    sent, rest, calls = streamed(code)
    assert "".join(sent) == code and rest == "" and not calls, "other code streams as it comes"
    assert "".join(sent[:3 // step + 1]).startswith("```p"), "released with the character that rules out a call"
    answer = '{"city": "Paris", "sky": "clear"}'
    sent, rest, calls = streamed(answer)
    assert "".join(sent) == "" and rest == answer and not calls, "JSON that is no call is held, then sent whole"
    sent, rest, calls = streamed('{"a": 1} ' + call("now", {}))
    assert (rest, [c["function"]["name"] for c in calls]) == ('{"a": 1}', ["now"]), "text before a tagged call stays"
