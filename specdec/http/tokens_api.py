"""`POST /tokenize` and `POST /detokenize` (vLLM's routes and shapes): the ids this server feeds the model for a
prompt or a conversation, and the text of ids. For clients that count tokens against the context or score
with ids (`echo` with a prompt of ids)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specdec.http.errors import BadRequest
from specdec.http.schema import ChatCompletionRequest, TokenIds
from specdec.http.validation import parse, validated


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: str | None = None
    messages: list[dict] | None = None  # a conversation, rendered as chat completions render it
    tools: list | None = None
    add_generation_prompt: bool | None = None  # with messages: as chat completions take them
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    add_special_tokens: bool = True  # as completions feed a prompt (a Llama's BOS; nothing for a Qwen)

    def refuse_unsupported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise BadRequest("give exactly one of prompt and messages", "prompt")


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    tokens: TokenIds  # as many as the body's size limit lets in

    def refuse_unsupported(self) -> None:
        pass


async def tokenize(request: Request) -> Response:
    """The prompt's ids as `/v1/completions` feeds them (or with the tokenizer's special tokens), or a
    conversation's as `/v1/chat/completions` does, template, tools and generation prompt included."""
    gateway = request.app.state.gateway
    body = parse(TokenizeRequest, await request.body())
    gateway.check_model(body.model)
    if body.prompt is not None:
        ids = list(gateway.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens))
    else:
        chat = body.model_dump(include={"model", "messages", "tools", "add_generation_prompt", "continue_final_message",
                                        "chat_template_kwargs"}, exclude_none=True)
        ids = gateway.chat_prompt(validated(ChatCompletionRequest, chat))
    return JSONResponse({"count": len(ids), "max_model_len": gateway.info.max_context, "tokens": ids})


async def detokenize(request: Request) -> Response:
    gateway = request.app.state.gateway
    body = parse(DetokenizeRequest, await request.body())
    gateway.check_model(body.model)
    vocab = gateway.info.vocab_size
    outside = [t for t in body.tokens if not 0 <= t < vocab]
    if outside:
        raise BadRequest(f"tokens outside the vocabulary [0, {vocab}): {outside[:5]}", "tokens")
    return JSONResponse({"prompt": gateway.tokenizer.decode(body.tokens)})
