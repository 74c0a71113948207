"""OpenAI request bodies, checked, and turned into the `GenerateRequest` they ask for.

Supported: `model`, `prompt` (a string or a list of token ids, or a list of those: several prompts, their choices
numbered prompt · n + choice) / `messages`, `max_tokens` /
`max_completion_tokens`, `temperature`, `top_p`, `top_k` (extension), `seed`, `stop`,
`logprobs`/`top_logprobs` (chat) and `logprobs: N` (completions), `echo` (completions: the prompt before the
completion, with its tokens' log-probabilities under `logprobs`, the first null; `max_tokens: 0` then scores the
prompt alone), `stream`,
`stream_options.include_usage`, `presence_penalty`, `frequency_penalty`, `logit_bias`, `n` (1-8),
`response_format` (text, json_object, json_schema), `tools`, `tool_choice` and `parallel_tool_calls` (chat;
`specdec.http.tool_calls`), vLLM's chat extensions `add_generation_prompt`, `continue_final_message` (the reply
continues the last message), `chat_template_kwargs` and `echo`, `suffix` (completions: fill in the middle, `specdec.http.infill`), and the
extensions `repetition_penalty`,
`guided_regex`, `guided_grammar` (Lark), `guided_json`, `guided_choice` and `structured_outputs` (vLLM's newer
form of them), `cache_salt` (cached prompts shared only within it), `min_tokens`,
`ignore_eos` and `stop_token_ids` (vLLM's: how the output may end, exact under speculation), `gamma` (unset =
adaptive, 0 = target-only), `proposer` ("model", "ngram" or "hybrid"), `overlap` ("auto", "on" or "off":
drafting during verification) and `sampler` ("coupled": a seed's output whatever the speculation, or
"rejection"); unset = the server's default. Penalties, bias and constraints are exact under speculation.
`best_of` (completions: the n likeliest of best_of, `specdec.http.best_of`). Refused with a 400 when set to
anything but their neutral value: the legacy `functions`, and non-text message parts.
Unknown fields are ignored, as OpenAI's own server does.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt

from protos import specdec_pb2 as pb
from specdec.core.params import MAX_CACHE_SALT, MAX_CHOICES, MAX_TOP_LOGPROBS
from specdec.http import structured, tool_calls
from specdec.http.errors import BadRequest
from specdec.http.structured import ResponseFormat, StructuredOutputs
from specdec.runtime.wire import constraint_to_pb, logprob_request_to_pb, speculation_to_pb

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_PROMPTS = 2048  # OpenAI's limit on a completions request's prompts
INT32_MAX, UINT32_MAX = 2**31 - 1, 2**32 - 1  # the wire's integer widths: anything wider is refused here
TokenIds = list[StrictInt]  # JSON integers only: `true` or "5" is not a token id


class StreamOptions(BaseModel):
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class PredictedContent(BaseModel):
    """OpenAI's `prediction` (Predicted Outputs): text the reply is expected to repeat much of."""
    model_config = ConfigDict(extra="ignore")
    type: Literal["content"]
    content: str | list[ContentPart]

    def text(self) -> str:
        return joined_text(self.content, "prediction content parts must be text", "prediction")


def joined_text(content: str | list[ContentPart] | None, refusal: str, param: str) -> str | None:
    """Content as a string: given as one, or its text parts joined; a part that is not text is a BadRequest
    (`refusal`, naming `param`)."""
    if not isinstance(content, list):
        return content
    if any(part.type != "text" or part.text is None for part in content):
        raise BadRequest(refusal, param)
    return "".join(part.text for part in content)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # OpenAI's default: 1
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)  # extension (0: off)
    seed: int | None = Field(None, ge=0, lt=2**63)  # unset: a fresh random seed per request
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=INT32_MAX)  # the orchestrator takes at most 8
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)  # extension (vLLM's): unset = 1, off
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's shape) -> bias in [-100, 100]
    gamma: int | None = Field(None, ge=0, le=INT32_MAX)  # extension: unset = adaptive, 0 = target-only, N = fixed
    proposer: Literal["model", "ngram", "hybrid"] | None = None  # extension: unset = the server's default
    overlap: Literal["auto", "on", "off"] | None = None  # extension: unset = the server's default
    sampler: Literal["coupled", "rejection"] | None = None  # extension: unset = the server's default
    response_format: ResponseFormat | None = None
    guided_regex: str | None = None  # extension (vLLM's name): the output matches this regex
    guided_grammar: str | None = None  # extension (vLLM's name): the output follows this Lark grammar
    guided_json: dict | str | None = None  # extension (vLLM's name): the output is JSON following this schema
    guided_choice: list[str] | None = None  # extension (vLLM's name): the output is one of these strings
    structured_outputs: StructuredOutputs | None = None  # extension: vLLM's newer form of the guided_* fields
    cache_salt: str = Field("", max_length=MAX_CACHE_SALT)  # extension (vLLM's): share cached prompts only within it
    min_tokens: int = Field(0, ge=0, le=UINT32_MAX)  # extension (vLLM's): no EOS or stop before this many tokens
    ignore_eos: bool = False  # extension (vLLM's): run past the model's EOS
    stop_token_ids: TokenIds | None = None  # extension (vLLM's): ids that end the output as EOS does
    prediction: PredictedContent | None = None  # drafted from (Predicted Outputs): the speed changes, not the reply
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # extension (vLLM's): k, per prompt token

    def constraint(self) -> tuple[str, str | bool | list[str]] | None:
        """The one structured-output constraint the body asks for, as (kind, value): a field of
        `pb.Constraint` and its value; or None."""
        return structured.the_one(self.constraints())

    def constraints(self) -> list[tuple[str, str, str | bool | list[str]]]:
        """Every constraint the body asks for, as (field, kind, value)."""
        return structured.requested(self)

    def refuse_unsupported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise BadRequest("stream_options needs stream: true", "stream_options")
        if self.prompt_logprobs is not None and self.stream:
            raise BadRequest("prompt_logprobs are not available with stream: true", "prompt_logprobs")

    def bias(self) -> dict[int, float]:
        """logit_bias with integer ids that fit the wire's int32; the orchestrator checks them against the
        vocabulary and the biases' range (`specdec.core.params.check_processing`)."""
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise BadRequest(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
            if not 0 <= token <= INT32_MAX:
                raise BadRequest(f"logit_bias needs ids in [0, {INT32_MAX}], got {key}", "logit_bias")
            bias[token] = value
        return bias

    def stops(self) -> list[str]:
        """More than OpenAI's 4 are served, as vLLM serves them (evaluation harnesses send more); the orchestrator
        holds its own limit (`--max-stop-strings`, 16)."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def generate_request(self, max_tokens: int, top_logprobs: int | None, **prompt) -> pb.GenerateRequest:
        """The GenerateRequest this body asks for; `prompt`: its prompt or prompt_token_ids field."""
        temperature = 1.0 if self.temperature is None else self.temperature
        seed = secrets.randbits(63) if self.seed is None else self.seed
        request = pb.GenerateRequest(max_new_tokens=max_tokens, temperature=temperature, top_k=max(self.top_k or 0, 0),
                                     seed=seed, stop=self.stops(), presence_penalty=self.presence_penalty,
                                     frequency_penalty=self.frequency_penalty, logit_bias=self.bias(),
                                     cache_salt=self.cache_salt,
                                     **logprob_request_to_pb(top_logprobs),
                                     **speculation_to_pb(self.proposer, self.overlap, self.sampler), **prompt)
        request.n = self.n
        request.min_tokens, request.ignore_eos = self.min_tokens, self.ignore_eos
        if any(not 0 <= t <= INT32_MAX for t in self.stop_token_ids or ()):
            raise BadRequest(f"stop_token_ids must be token ids in [0, {INT32_MAX}]", "stop_token_ids")
        request.stop_token_ids.extend(self.stop_token_ids or ())
        constraint = self.constraint()
        if constraint is not None:
            request.constraint.CopyFrom(constraint_to_pb(*constraint))
        if self.repetition_penalty is not None:
            request.repetition_penalty = self.repetition_penalty
        if self.top_p is not None:
            request.top_p = self.top_p
        if self.gamma is not None:
            request.gamma = self.gamma
        if self.prediction is not None:
            request.prediction = self.prediction.text()
        if self.prompt_logprobs is not None:  # one k serves both: the larger, each part cut to its own
            request.prompt_logprobs, request.top_logprobs = True, max(request.top_logprobs, self.prompt_logprobs)
        return request


class CompletionRequest(_Common):
    prompt: Any  # a string or token ids, or a list of those: read (and refused, by element) by `prompts()`
    max_tokens: int | None = Field(COMPLETIONS_DEFAULT_MAX_TOKENS, ge=0, le=UINT32_MAX)  # 0: with echo only
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)  # generated per prompt, the n likeliest returned

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.best_of is not None and self.best_of < self.n:
            raise BadRequest(f"best_of must be at least n ({self.n}), got {self.best_of}", "best_of")
        if self.ranked() and self.stream:
            raise BadRequest("best_of > n cannot be streamed: the best are known only at the end", "best_of")
        if self.ranked() and self.max_tokens == 0:
            raise BadRequest("best_of > n needs completions to rank (max_tokens > 0)", "best_of")
        if self.max_tokens == 0 and not self.echo:
            raise BadRequest("max_tokens must be at least 1 (0 only with echo: the prompt scored alone)", "max_tokens")
        if self.echo and self.suffix:
            raise BadRequest("echo cannot be combined with suffix", "echo")

    def ranked(self) -> bool:
        """Are more choices generated than returned (`best_of` > n)?"""
        return self.best_of is not None and self.best_of > self.n

    def generated(self) -> int:
        """Choices generated per prompt."""
        return self.best_of if self.ranked() else self.n

    def scores_only(self) -> bool:
        """`echo` with `max_tokens: 0`: the prompt (and its log-probabilities) and no completion."""
        return self.echo and self.max_tokens == 0

    def completion_request(self, **prompt) -> pb.GenerateRequest:
        """The GenerateRequest: with `echo` and `logprobs`, the prompt's log-probabilities too; scoring the prompt
        alone generates one target-only token, which the reply leaves out."""
        if self.scores_only():
            request = self.generate_request(1, self.logprobs, **prompt)
            request.gamma = 0
        else:
            request = self.generate_request(self.max_tokens, self.reported_logprobs(), **prompt)
        request.prompt_logprobs |= self.echo and self.logprobs is not None
        request.n = self.generated()
        return request

    def reported_logprobs(self) -> int | None:
        """The top logprobs the reply is built with: the client's, or the sampled tokens' alone to rank them by."""
        return self.logprobs if self.logprobs is not None or not self.ranked() else 0

    def prompts(self) -> list[dict]:
        """Each prompt as {'prompt': text} or {'prompt_token_ids': ids}: one string or list of token ids, or a
        list of either (a batch, at most MAX_PROMPTS); a list is a batch when its first element is a string or
        a list. A malformed element is a BadRequest naming it."""
        prompt = self.prompt
        batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        if not batch:
            return [_prompt_field(prompt, "prompt")]
        if len(prompt) > MAX_PROMPTS:
            raise BadRequest(f"at most {MAX_PROMPTS} prompts in one request, got {len(prompt)}", "prompt")
        return [_prompt_field(one, f"prompt[{i}]") for i, one in enumerate(prompt)]


def _prompt_field(prompt, where: str) -> dict:
    """One prompt: a string, or a non-empty list of 32-bit JSON integers."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if not isinstance(prompt, list) or not prompt:
        of_those = ", or a list of those" if where == "prompt" else ""
        raise BadRequest(f"{where} must be a string or a non-empty list of token ids{of_those}", "prompt")
    for i, token in enumerate(prompt):
        if type(token) is not int:  # noqa: E721 (bool is an int subclass, and not a token id)
            raise BadRequest(f"{where}[{i}] must be a token id (an integer), got {json.dumps(token)[:40]}", "prompt")
        if not -INT32_MAX - 1 <= token <= INT32_MAX:
            raise BadRequest("prompt token ids must be 32-bit integers", "prompt")
    return {"prompt_token_ids": prompt}


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: handed on to the chat template
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def for_template(self) -> dict[str, Any]:
        content = joined_text(self.content, "only text content parts are supported", "messages")
        role = "system" if self.role == "developer" else self.role
        extra = dict(self.model_extra or {})
        if extra.get("tool_calls"):
            extra["tool_calls"] = template_calls(extra["tool_calls"])
        return {**extra, "role": role, "content": content or ""}


def template_calls(calls) -> list[dict]:
    """An assistant message's earlier tool calls as chat templates render them: arguments as an object (OpenAI
    sends them as a JSON string, which a template's `tojson` would quote again)."""
    if not isinstance(calls, list):
        raise BadRequest("an assistant message's tool_calls must be a list", "messages")
    rendered = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest("each tool call needs a function with a name", "messages")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                raise BadRequest(f"tool call {function['name']!r} has arguments that are not JSON", "messages") from None
        rendered.append({**call, "function": {**function, "arguments": arguments}})
    return rendered


# apply_chat_template's own parameters: what chat_template_kwargs may not set
TEMPLATE_ARGUMENTS = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                                "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                                "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


class ChatCompletionRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    functions: list | None = None
    add_generation_prompt: bool | None = None  # extension (vLLM's): unset = true, false with continue_final_message
    continue_final_message: bool = False  # extension (vLLM's): the reply continues the last message, left open
    chat_template_kwargs: dict[str, Any] | None = None  # extension (vLLM's): more variables for the chat template
    echo: bool = False  # extension (vLLM's): the reply starts with the last message's text when it is the assistant's
    _tools: dict[str, tool_calls.Tool] = PrivateAttr(default_factory=dict)
    _choice: str = PrivateAttr("none")

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.functions:
            raise BadRequest("functions (the legacy form) are not supported: use tools", "functions")
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise BadRequest("continue_final_message leaves the last message open: it cannot be combined with "
                             "add_generation_prompt: true", "continue_final_message")
        reserved = sorted(TEMPLATE_ARGUMENTS & set(self.chat_template_kwargs or ()))
        if reserved:
            raise BadRequest(f"chat_template_kwargs cannot set {', '.join(reserved)}: they are the request's own",
                             "chat_template_kwargs")
        try:
            self._tools = tool_calls.read_tools(self.tools or [])
        except tool_calls.ToolError as exc:
            raise BadRequest(str(exc), "tools") from None
        try:
            self._choice = tool_calls.read_choice(self.tool_choice, self._tools)
        except tool_calls.ToolError as exc:
            raise BadRequest(str(exc), "tool_choice") from None
        asked = self.constraints() if self._choice not in ("none", "auto") else []
        if asked:
            raise BadRequest(f"a tool_choice that forces a call cannot be combined with {asked[0][0]}", "tool_choice")

    def offered_tools(self) -> dict[str, tool_calls.Tool]:
        """The tools the model is shown and may call: none where tool_choice is "none"."""
        return {} if self._choice == "none" else self._tools

    def constraint(self) -> tuple[str, str | bool] | None:
        if self._choice in ("none", "auto"):
            return super().constraint()
        return "lark", tool_calls.forcing_grammar(self._tools, self._choice, self.parallel_tool_calls)

    def template_arguments(self) -> dict[str, Any]:
        """What the chat template is rendered with, besides the messages and tools."""
        generation_prompt = not self.continue_final_message if self.add_generation_prompt is None \
            else self.add_generation_prompt
        return {**(self.chat_template_kwargs or {}), "add_generation_prompt": generation_prompt,
                "continue_final_message": self.continue_final_message}

    def echoed(self) -> str | None:
        """With `echo`, the text the reply starts with: the last message's, if it is the assistant's (the reply's
        role), as vLLM echoes."""
        last = self.messages[-1]
        return last.for_template()["content"] if self.echo and last.role == "assistant" else None

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def length_field(self) -> str:
        """The field the reply's length came from."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def top(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
