"""The Responses API's request (`POST /v1/responses`), read as the chat completion it asks for.

A request's `instructions`, the stored conversation it goes on from (`previous_response_id`, whose
instructions are not carried over, as OpenAI's are not) and its `input` items become chat messages:
- a message item (`{"role", "content"}`, content a string or `input_text` / `output_text` parts) -> that message;
- `function_call` items -> the calls of an assistant message (joined to the assistant message just before,
  as the model wrote them: text, then its calls);
- `function_call_output` -> a `tool` message answering that call_id;
- `reasoning` items carry nothing this model reads, and are skipped.
Function tools (`{"type": "function", "name", "parameters", ...}`), `tool_choice`, `parallel_tool_calls`,
`text.format` (text, json_object, json_schema), `max_output_tokens`, `temperature`, `top_p`,
`top_logprobs` with `include: ["message.output_text.logprobs"]` map onto their chat fields, and the chat
API's extensions (`seed`, `top_k`, `stop`, penalties, `logit_bias`, `gamma`, `proposer`, `overlap`, `sampler`,
`guided_*`, `structured_outputs`, `cache_salt`) pass through. `background` runs the reply apart from the request
(`specdec.http.background`). Refused with a 400: other tool types, `conversation`, non-text input parts, and
log-probabilities together with tools.

`truncation: "auto"`: a conversation that does not fit the context (with room for `max_output_tokens`, or for
one token) loses its oldest messages until it does (`fitted`): never the instructions nor the last message, and
a tool's output only with the call it answers (unless it is the last message). Nothing stored is dropped: each
request fits it anew.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from specdec.core.params import MAX_TOP_LOGPROBS
from specdec.http import tool_calls
from specdec.http.errors import BadRequest
from specdec.http.schema import UINT32_MAX, ChatCompletionRequest
from specdec.http.validation import validated

LOGPROBS = "message.output_text.logprobs"
# `include` values OpenAI defines; but for the text's log-probabilities, what they include never occurs here
INCLUDABLE = frozenset({LOGPROBS, "reasoning.encrypted_content", "file_search_call.results",
                        "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
                        "computer_call_output.output.image_url", "code_interpreter_call.outputs"})
EXTENSIONS = ("seed", "top_k", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
              "gamma", "proposer", "overlap", "sampler", "guided_regex", "guided_grammar", "guided_json",
              "guided_choice", "structured_outputs", "cache_salt")
TEXT_PARTS = ("input_text", "output_text", "text")
MAX_METADATA = 16  # OpenAI's limits on metadata: pairs, key and value lengths
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # the chat API's extensions (EXTENSIONS); anything else is ignored

    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[Any] = Field(default_factory=list)
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    include: list[str] = Field(default_factory=list)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    background: bool | None = None
    conversation: Any = None
    truncation: Literal["disabled", "auto"] | None = None
    reasoning: dict | None = None  # accepted and ignored: the model does not reason apart from its reply
    user: str | None = None

    def refuse_unsupported(self) -> None:
        if self.background and not self.store:
            raise BadRequest("background needs store: true (its result is read with GET /v1/responses/{id})",
                             "background")
        if self.conversation is not None:
            raise BadRequest("conversations are not supported: use previous_response_id", "conversation")
        unknown = sorted(set(self.include) - INCLUDABLE)
        if unknown:
            raise BadRequest(f"include: unknown value {unknown[0]!r}", "include")
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequest(f"top_logprobs needs include: [{LOGPROBS!r}]", "top_logprobs")
        if self.logprobs and self.tools and self.tool_choice != "none":
            raise BadRequest("log-probabilities of a reply that may call tools are not supported", "include")
        metadata = self.metadata or {}
        if len(metadata) > MAX_METADATA or any(len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE
                                                for k, v in metadata.items()):
            raise BadRequest(f"metadata: at most {MAX_METADATA} pairs, keys of at most {MAX_METADATA_KEY} "
                             f"characters, values of at most {MAX_METADATA_VALUE}", "metadata")

    @property
    def logprobs(self) -> bool:
        return LOGPROBS in self.include

    def input_items(self) -> list[dict]:
        """The input as `GET /v1/responses/{id}/input_items` lists it: items with their ids (given, or new), text
        content as parts. Read after `chat_request`, which refuses items that cannot be served."""
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        listed = []
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                content = item["content"]
                if isinstance(content, str):
                    content = [{"type": "output_text" if item["role"] == "assistant" else "input_text", "text": content}]
                listed.append({"type": "message", "id": item.get("id") or new_id("msg"), "role": item["role"],
                               "content": content, "status": item.get("status", "completed")})
            else:
                prefix = {"function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
                listed.append({**item, "id": item.get("id") or new_id(prefix)})
        return listed

    @functools.cached_property
    def input_messages(self) -> list[dict]:
        """The chat messages this request's input items add to the conversation (read once: the prompt's, and
        the stored conversation's part)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return chat_messages(self.input)

    def chat_request(self, conversation: list[dict], dropped: int = 0) -> ChatCompletionRequest:
        """The chat completion this request asks for, after the stored `conversation` it goes on from, without
        its first `dropped` messages (and a tool's output left without its call), the instructions kept."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages = [*conversation, *self.input_messages][dropped:]
        while dropped and len(messages) > 1 and messages[0]["role"] == "tool":
            messages = messages[1:]
        body: dict[str, Any] = {"model": self.model, "messages": [*system, *messages],
                                "parallel_tool_calls": self.parallel_tool_calls, "logprobs": self.logprobs}
        optional = {"max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
                    "top_p": self.top_p, "top_logprobs": self.top_logprobs if self.logprobs else None,
                    "tools": chat_tools(self.tools) or None, "tool_choice": chat_tool_choice(self.tool_choice),
                    "response_format": self.response_format()}
        body.update({key: value for key, value in optional.items() if value is not None})
        body.update({key: value for key, value in (self.model_extra or {}).items() if key in EXTENSIONS})
        return validated(ChatCompletionRequest, body, {"messages": "input", "response_format": "text.format",
                                                       "max_completion_tokens": "max_output_tokens"})

    def fitted(self, conversation: list[dict], render: Callable[[ChatCompletionRequest], list[int]],
               context: int) -> tuple[ChatCompletionRequest, list[int]]:
        """The chat request and its prompt ids (`render`); with truncation "auto", the fewest oldest messages
        dropped (a binary search: dropping more never lengthens the prompt) for the prompt and the reply's room
        (`max_output_tokens`, else one token) to fit `context`. Raises BadRequest if not even the last message
        fits."""
        chat = self.chat_request(conversation)
        prompt = render(chat)
        room = self.max_output_tokens or 1
        if self.truncation != "auto" or len(prompt) + room <= context:
            return chat, prompt
        last = len(conversation) + len(self.input_messages) - 1  # dropping this many leaves the last message
        shortest = len(render(self.chat_request(conversation, last)))
        if shortest + room > context:
            raise BadRequest(f"the input's last message (with the instructions) takes {shortest} tokens: with room "
                             f"for {room} more it exceeds the context of {context}", "input")
        low, high = 1, last  # the fewest drops that fit lie in [low, high], and `high` fits
        while low < high:
            middle = (low + high) // 2
            if len(render(self.chat_request(conversation, middle))) + room <= context:
                high = middle
            else:
                low = middle + 1
        chat = self.chat_request(conversation, high)
        return chat, render(chat)

    def response_format(self) -> dict | None:
        form = self.text.format
        if form.type == "json_schema":
            if form.schema_ is None:
                raise BadRequest("text.format json_schema needs its schema", "text.format")
            return {"type": "json_schema", "json_schema": {"name": form.name, "schema": form.schema_,
                                                           "strict": form.strict}}
        return None if form.type == "text" else {"type": form.type}

    def echo(self) -> dict:
        """The request's settings as a response object repeats them."""
        return {"instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
                "temperature": 1.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p, "tools": self.tools,
                "tool_choice": self.tool_choice or "auto", "parallel_tool_calls": self.parallel_tool_calls,
                "text": {"format": self.text.format.model_dump(by_alias=True, exclude_none=True)
                         if self.text.format.type == "json_schema" else {"type": self.text.format.type}},
                "previous_response_id": self.previous_response_id, "store": self.store,
                "metadata": self.metadata or {}, "top_logprobs": self.top_logprobs,
                "truncation": self.truncation or "disabled", "reasoning": {"effort": None, "summary": None},
                "background": bool(self.background), "user": self.user}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def chat_messages(items: list) -> list[dict]:
    """Input items as chat messages (see the module's docstring)."""
    messages: list[dict] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"input[{i}].role must be user, assistant, system or developer, got {role!r}",
                                 "input")
            messages.append({"role": role, "content": item_text(item.get("content"), f"input[{i}].content")})
        elif kind == "function_call":
            call_id, name, arguments = (item.get(key) for key in ("call_id", "name", "arguments"))
            if not all(isinstance(value, str) for value in (call_id, name, arguments)):
                raise BadRequest(f"input[{i}]: a function_call needs call_id, name and arguments as strings", "input")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise BadRequest(f"input[{i}]: a function_call_output needs its call_id", "input")
            output = item.get("output")
            text = output if isinstance(output, str) else item_text(output, f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind != "reasoning":
            raise BadRequest(f"input[{i}]: items of type {kind!r} are not supported", "input")
    return messages


def item_text(content, where: str) -> str:
    """A message's content as text: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        if any(part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str) for part in content):
            raise BadRequest(f"{where}: only text parts ({', '.join(TEXT_PARTS)}) are supported", "input")
        return "".join(part["text"] for part in content)
    raise BadRequest(f"{where} must be a string or a list of text parts", "input")


def chat_tools(tools: list) -> list[dict]:
    """Function tools as the chat API nests them (refused, with the reason, if they are not function tools)."""
    try:
        return [tool.spec for tool in tool_calls.read_tools(tools, flat=True).values()]
    except tool_calls.ToolError as exc:
        raise BadRequest(str(exc), "tools") from None


def chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise BadRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                             "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def output_message(content: str, calls: list[dict]) -> dict:
    """The chat message a reply adds to its conversation: its text and its calls (the chat API's shape)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message

