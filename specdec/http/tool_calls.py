"""Tool calls in the chat API: the tools a request offers, the grammar that forces a call, and the calls read
back out of the model's text.

The format is the one Qwen2.5 (and Hermes) chat templates teach their models: each call is a JSON object
with the function's name and arguments inside tags,
    <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>
A chat template that renders tools in another format is refused (`check_template`). `tool_choice`:
- "none": the tools are left out of the prompt, and the reply is text;
- "auto" (the default with tools): the model writes text, calls, or both; the calls are read from the text.
  A reply that is nothing but a call's JSON object (or a list of them), bare or in one Markdown ```json
  block, is read as those calls too: small models taught the tags often write that instead (the packaged
  1.5B coder does);
- "required" or one named function: the reply is constrained (llguidance, exact under speculation like any
  other constraint) to one call, or with `parallel_tool_calls` one or more, whose arguments follow each
  function's parameter schema.
Plain functions, no grpc: the HTTP layer calls them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from specdec.core.grammar import JSON_LAYOUT
from specdec.core.text import partial_len

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}  # a function without arguments
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")  # a flat tool's fields that describe its function
CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
FENCED = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.DOTALL)  # one Markdown block, its JSON inside
BARE_START = re.compile(r"```(?:json)?\s*[\[{]")  # a reply that began so may be a bare call
FENCE_OPENING = re.compile(r"```(?:json)?\s*")  # a reply that is so far only this may become one


class ToolError(ValueError):
    """A request's tools or tool_choice that cannot be served: the message says which and why."""


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict  # a JSON schema for the arguments object
    spec: dict  # the tool as the request gave it: what the chat template renders


def read_tools(tools: list, flat: bool = False) -> dict[str, Tool]:
    """The request's `tools`, by name: each {"type": "function", "function": {"name", "parameters", ...}} (the chat
    API's shape) or, `flat`, {"type": "function", "name", "parameters", ...} (the Responses API's); each Tool's
    spec in the chat API's shape, as chat templates render it."""
    read: dict[str, Tool] = {}
    for i, tool in enumerate(tools):
        kind = tool.get("type", "function") if isinstance(tool, dict) else None
        function = tool if flat else (tool.get("function") if isinstance(tool, dict) else None)
        if flat and kind != "function":
            raise ToolError(f"tools[{i}]: only function tools are supported, got type {kind!r}")
        if kind != "function" or not isinstance(function, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        where = f"tools[{i}]" if flat else f"tools[{i}].function"
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolError(f"{where}.name must be 1-64 letters, digits, '_' or '-', got {name!r}")
        if name in read:
            raise ToolError(f"two tools are named {name!r}")
        parameters = function.get("parameters", NO_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ToolError(f"{where}.parameters must be a JSON schema object")
        spec = {key: function[key] for key in FUNCTION_FIELDS if key in function} if flat else function
        read[name] = Tool(name, parameters, {"type": "function", "function": spec})
    return read


def read_choice(choice, tools: dict[str, Tool]) -> str:
    """`tool_choice` as "none", "auto", "required", or the one function's name it forces."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ToolError(f"tool_choice {choice!r} needs tools")
        return choice
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if name is None:
        raise ToolError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
    if name not in tools:
        raise ToolError(f"tool_choice names {name!r}, which is not among the tools")
    return name


def check_template(template: str | None) -> None:
    """Tools need a chat template that renders them and teaches the <tool_call> format."""
    if not template or OPEN not in template:
        raise ToolError("this model's chat template has no <tool_call> format: tools are not supported for it")


def forcing_grammar(tools: dict[str, Tool], choice: str, parallel: bool) -> str:
    """The Lark grammar (llguidance's, with %json) that a "required" or named tool_choice constrains the
    reply to: one call, or with `parallel` one or more, each naming a tool and giving arguments that follow
    its parameters."""
    names = [choice] if choice in tools else list(tools)
    calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": tools[name].parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for name in names]
    schema = {"x-guidance": JSON_LAYOUT, **(calls[0] if len(calls) == 1 else {"anyOf": calls})}
    more = ' ("\\n" call)*' if parallel and choice not in tools else ""
    return (f'start: call{more}\n'
            f'call: "{OPEN}\\n" body "\\n{CLOSE}"\n'
            f'body: %json {json.dumps(schema)}')


def parse_calls(text: str, tools: dict[str, Tool]) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a whole reply: the text before the first call (None if blank), and each call in
    OpenAI's shape with its arguments as a JSON string. A call that does not parse, or names no tool, leaves
    the whole text as content and no calls, as a reply of text. Without tags, a reply that is only calls'
    JSON (`bare_calls`) is those calls."""
    start = text.find(OPEN)
    if start < 0:
        calls = bare_calls(text, tools)
        return (None, calls) if calls else (text, [])
    calls = []
    rest = text[start:]
    for match in CALL.finditer(rest):
        call = read_call(match.group(1), tools)
        if call is None:
            return text, []
        calls.append(call)
    if not calls or CALL.sub("", rest).strip():
        return text, []  # an unclosed call, or text between or after the calls
    content = text[:start].strip()
    return content or None, calls


def read_call(body: str, tools: dict[str, Tool]) -> dict | None:
    """One call's JSON ({"name", "arguments"}) in OpenAI's shape, or None if it is not a call of a tool."""
    try:
        return call_of(json.loads(body), tools)
    except json.JSONDecodeError:
        return None


def call_of(value, tools: dict[str, Tool]) -> dict | None:
    if not isinstance(value, dict) or value.get("name") not in tools or not isinstance(value.get("arguments", {}), dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(value.get("arguments", {}))}}


def bare_calls(text: str, tools: dict[str, Tool]) -> list[dict]:
    """The calls of a reply that is nothing but one call's JSON object or a list of them, bare or as the one
    Markdown ```json block of the reply; else none."""
    body = text.strip()
    fenced = FENCED.fullmatch(body)
    if fenced:
        body = fenced.group(1)
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return []
    values = value if isinstance(value, list) and value else [value]
    calls = [call_of(v, tools) for v in values]
    return calls if all(calls) else []


def may_be_bare_call(text: str) -> bool:
    """Whether a reply that begins with `text` could still be nothing but calls' JSON (`bare_calls`)."""
    start = text.lstrip()
    if not start or start[0] in "[{" or BARE_START.match(start):
        return True
    return "```json".startswith(start) or FENCE_OPENING.fullmatch(start) is not None


class ToolStream:
    """One streamed choice's text, split as it arrives: content that cannot be the start of a call goes out at
    once; from the first <tool_call> on the text is held, and at the end read as calls (or, if it does not
    parse as calls, sent as content after all). A reply that could still be nothing but calls' bare JSON is
    held whole while it could (`may_be_bare_call`)."""

    def __init__(self, tools: dict[str, Tool]):
        self.tools = tools
        self.held = ""  # text not yet sent: a possible start of <tool_call>, or everything from one on
        self.calling = False
        self.bare = True  # all the reply so far is held: it may be nothing but calls' JSON

    def push(self, text: str) -> str:
        """Add a delta; returns the content that can go out now."""
        self.held += text
        if self.bare:
            self.bare = may_be_bare_call(self.held)
            if self.bare:
                return ""
        if not self.calling:
            at = self.held.find(OPEN)
            if at >= 0:
                out, self.held, self.calling = self.held[:at], self.held[at:], True
            else:
                keep = partial_len(self.held, (OPEN,))
                out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
            return out
        return ""

    def finish(self) -> tuple[str, list[dict]]:
        """(content still to send, the calls): called once the choice has ended."""
        content, calls = parse_calls(self.held, self.tools) if self.calling or self.bare else (None, [])
        out, self.held = ((content or "") if calls else self.held), ""  # held from a call on: its content is none
        return out, calls
