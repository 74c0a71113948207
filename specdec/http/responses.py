"""OpenAI response bodies from `GenerateResponse` messages: completions, chat, their stream chunks,
logprobs in both of OpenAI's shapes, and usage with the speculation figures as an extension."""

from __future__ import annotations

import functools
import itertools
import time
import uuid
from dataclasses import dataclass

from protos import specdec_pb2 as pb
from specdec.http.best_of import BestOf
from specdec.http.tool_calls import Tool, ToolStream, parse_calls
from specdec.weights.sources import gpt2_byte_chars

FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_CONTEXT: "length"}


class TokenText:
    """A token id's text (as decoded alone) and its exact bytes, for logprobs."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._byte_of = {char: byte for byte, char in gpt2_byte_chars().items()}

    @functools.lru_cache(maxsize=65536)
    def text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    @functools.lru_cache(maxsize=65536)
    def bytes(self, token_id: int) -> list[int]:
        """Byte-level BPE pieces map back to their bytes; other tokens are their text in UTF-8."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is not None and all(char in self._byte_of for char in piece):
            return [self._byte_of[char] for char in piece]
        return list(self.text(token_id).encode("utf-8"))


@dataclass(frozen=True)
class Echo:
    """A completion's prompts, each put before its choices' text (`echo`), its tokens' log-probabilities before
    the completion's; `drop_output`: no completion at all (`max_tokens: 0`, the prompts scored alone). In chat:
    the last message's text, the assistant's, before the reply that continues it."""

    texts: tuple[str, ...]  # by prompt
    drop_output: bool = False


class Reply:
    """One request's identity and accumulated state: text, token logprobs and the final stats."""

    def __init__(self, kind: str, model: str, tokens: TokenText, top: int | None, tools: dict[str, Tool] | None = None,
                 echo: Echo | None = None, n: int = 1, best: BestOf | None = None, prompt_top: int | None = None):
        """top: alternatives per token when its logprobs are asked for; tools: those the model may call (chat),
        whose calls are read out of each choice's text; echo: a completion's prompts, repeated before their
        choices; n: choices generated per prompt (choice c is prompt c // n's); best: which of them the whole reply
        keeps (`best_of`); prompt_top: vLLM's `prompt_logprobs`, alternatives per prompt token (`prompt_scores`)."""
        self.kind, self.model, self.tokens, self.top = kind, model, tokens, top  # kind: "completion" | "chat"
        self.tools, self.echo, self.n, self.best, self.prompt_top = tools or {}, echo, n, best, prompt_top
        self._prompt_logprobs: dict[int, dict] = {}  # with echo: each prompt's part, from the message carrying it
        self._prompt_scores: dict[int, list] = {}  # with prompt_top: each prompt's, in vLLM's shape
        self._echoed: set[int] = set()  # choices whose echo has gone out
        self._splits: dict[int, ToolStream] = {}  # streamed choices' text, split into content and calls
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text_offset: dict[int, int] = {}  # completions: characters emitted so far, per choice
        self.stats: dict[int, pb.GenerationStats] = {}  # each choice's final stats

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def content(self, message: pb.GenerateResponse) -> tuple[str, dict | None]:
        """What a message adds to its choice: its text and logprobs, after the echoed prompt on a choice's first."""
        if self.best is not None:
            self.best.add(message)
        prompt = message.choice // self.n
        if message.prompt_token_ids and self.prompt_top is not None:  # the prompt's first choice's first message
            self._prompt_scores[prompt] = self.prompt_scores(message)
        if self.echo is None:
            return message.text, self.logprobs(message)
        if message.prompt_token_ids and self.top is not None:  # its other choices come after
            self._prompt_logprobs[prompt] = self._prompt_part(message)
        text, logprobs = "", None
        if message.choice not in self._echoed:
            self._echoed.add(message.choice)
            text, logprobs = self.echo.texts[prompt], self._prompt_logprobs.get(prompt)
            self.text_offset[message.choice] = len(text)
        if self.echo.drop_output:
            return text, logprobs
        return text + message.text, self.merge_logprobs([logprobs, self.logprobs(message)])

    # -- logprobs ---------------------------------------------------------------
    def _prompt_part(self, message: pb.GenerateResponse) -> dict:
        """The legacy logprobs of the prompt's tokens: the first has none (nothing comes before it)."""
        texts = [self.tokens.text(t) for t in message.prompt_token_ids]
        return {"tokens": texts, "token_logprobs": [None, *(lp.logprob for lp in message.prompt_logprobs)],
                "top_logprobs": [None, *(self._top_by_text(lp) for lp in message.prompt_logprobs)],
                "text_offset": list(itertools.accumulate((len(text) for text in texts[:-1]), initial=0))}

    def logprobs(self, message: pb.GenerateResponse) -> dict | None:
        if self.top is None:
            return None
        if self.kind == "chat":
            return {"content": [self._chat_entry(token, lp) for token, lp in zip(message.token_ids, message.logprobs)]}
        texts = [self.tokens.text(t) for t in message.token_ids]
        offsets = []
        for text in texts:
            offsets.append(self.text_offset.get(message.choice, 0))
            self.text_offset[message.choice] = offsets[-1] + len(text)
        return {"tokens": texts, "token_logprobs": [lp.logprob for lp in message.logprobs],
                "top_logprobs": [self._top_by_text(lp) for lp in message.logprobs],
                "text_offset": offsets}

    def prompt_scores(self, message: pb.GenerateResponse) -> list[dict | None]:
        """vLLM's `prompt_logprobs`: per prompt token (None for the first, which nothing comes before), its own and
        the `prompt_top` likeliest tokens' log-probability, rank and text, by token id."""
        scores: list[dict | None] = [None]
        for token, lp in zip(message.prompt_token_ids[1:], message.prompt_logprobs):
            scored = {token: self._scored(token, lp.logprob, lp.rank)}
            for rank, (other, value) in enumerate(self._alternatives(lp, self.prompt_top), 1):
                scored.setdefault(other, self._scored(other, value, rank))
            scores.append(scored)
        return scores

    def _scored(self, token: int, logprob: float, rank: int) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": self.tokens.text(token)}

    @staticmethod
    def _alternatives(lp: pb.TokenLogprob, top: int | None):
        """(token, log-probability) of the `top` likeliest (the message may carry more: one k serves a request's
        tokens and its prompt, the larger of the two)."""
        return zip(lp.top_ids[:top or 0], lp.top_logprobs)

    def _top_by_text(self, lp: pb.TokenLogprob) -> dict[str, float]:
        """The legacy shape: alternatives keyed by text; tokens that decode alike keep the likeliest."""
        top: dict[str, float] = {}
        for token, value in self._alternatives(lp, self.top):
            top.setdefault(self.tokens.text(token), value)
        return top

    def _chat_entry(self, token: int, lp: pb.TokenLogprob) -> dict:
        entry = self._chat_token(token, lp.logprob)
        entry["top_logprobs"] = [self._chat_token(t, v) for t, v in self._alternatives(lp, self.top)]
        return entry

    def _chat_token(self, token: int, logprob: float) -> dict:
        return {"token": self.tokens.text(token), "logprob": logprob, "bytes": self.tokens.bytes(token)}

    @staticmethod
    def merge_logprobs(parts: list[dict | None]) -> dict | None:
        """The logprobs of a whole reply from its messages'."""
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        return {key: [item for part in parts for item in part[key]] for key in parts[0]}

    # -- bodies --------------------------------------------------------------------
    def usage(self) -> dict:
        """Tokens over all choices (each prompt once); speculation figures summed over them."""
        stats = list(self.stats.values()) or [pb.GenerationStats()]
        first: dict[int, pb.GenerationStats] = {}  # each prompt's first choice's
        for choice, s in sorted(self.stats.items()):
            first.setdefault(choice // self.n, s)
        prompts = list(first.values()) or stats
        prompt_tokens = sum(s.prompt_tokens for s in prompts)
        generated = 0 if self.echo is not None and self.echo.drop_output else sum(s.generated_tokens for s in stats)
        drafted, accepted = sum(s.draft_tokens for s in stats), sum(s.accepted_tokens for s in stats)
        rounds = sum(s.rounds for s in stats)
        mean_length = sum(s.mean_accepted_length * s.rounds for s in stats) / rounds if rounds else 0.0
        return {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                "total_tokens": prompt_tokens + generated,
                "prompt_tokens_details": {"cached_tokens": sum(s.cached_prompt_tokens for s in prompts)},
                "completion_tokens_details": {
                    "accepted_prediction_tokens": sum(s.prediction_accepted_tokens for s in stats),
                    "rejected_prediction_tokens": sum(s.prediction_rejected_tokens for s in stats)},
                "speculation": {"drafted": drafted, "accepted": accepted,
                                "acceptance_rate": accepted / drafted if drafted else 0.0,
                                "mean_accepted_length": mean_length, "rounds": rounds}}

    def finish_reason(self, choice: int = 0) -> str | None:
        if self.echo is not None and self.echo.drop_output:
            return "length"
        stats = self.stats.get(choice)
        return FINISH.get(stats.finish_reason) if stats is not None else None

    async def settle(self, body: dict) -> None:
        """Anything to do with the finished body before the client has it (a Responses reply stores it)."""

    def whole(self, texts: dict[int, str], logprobs: dict[int, dict | None]) -> dict:
        """The non-streamed reply: one choice per index."""
        choices = []
        for index in sorted(texts):
            if self.kind == "chat":
                message, finish = {"role": "assistant", "content": texts[index]}, self.finish_reason(index)
                if self.tools:
                    message["content"], calls = parse_calls(texts[index], self.tools)
                    if calls:
                        message["tool_calls"], finish = calls, "tool_calls"
                choices.append({"index": index, "message": message, "logprobs": logprobs.get(index),
                                "finish_reason": finish})
            else:
                choices.append({"index": index, "text": texts[index], "logprobs": logprobs.get(index),
                                "finish_reason": self.finish_reason(index)})
                if self.prompt_top is not None:  # vLLM's place for them in a completion: each choice
                    choices[-1]["prompt_logprobs"] = self._prompt_scores.get(index // self.n)
        if self.best is not None:
            choices = self.best.pick(choices)
        body = self._envelope("chat.completion" if self.kind == "chat" else "text_completion", choices)
        if self.kind == "chat" and self.prompt_top is not None:  # and in chat: the reply's
            body["prompt_logprobs"] = self._prompt_scores.get(0)
        return {**body, "usage": self.usage()}

    def chunk(self, text: str, logprobs: dict | None, finish_reason: str | None = None, first: bool = False,
              index: int = 0) -> dict:
        """One streamed chunk of choice `index`; the chat stream's first chunk of a choice names the role."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def stream_text(self, text: str, index: int = 0) -> str:
        """What of a choice's new text can be streamed now: all of it, or with tools, none of a tool call."""
        if not self.tools:
            return text
        return self._splits.setdefault(index, ToolStream(self.tools)).push(text)

    def held(self, index: int = 0) -> tuple[str, list[dict]]:
        """Once a streamed choice has ended: the text `stream_text` held back that is content after all, and the
        tool calls read from the rest."""
        split = self._splits.get(index)
        return split.finish() if split is not None else ("", [])

    def closing_chunks(self, index: int = 0) -> list[dict]:
        """A streamed choice's last chunks: with tools, the text held back and the calls; then its finish reason."""
        chunks, finish = [], self.finish_reason(index)
        rest, calls = self.held(index)
        if rest:
            chunks.append(self.chunk(rest, None, index=index))
        if calls:
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            chunks.append(self._envelope("chat.completion.chunk", [choice]))
            finish = "tool_calls"
        return [*chunks, self.chunk("", None, finish, index=index)]

    def usage_chunk(self) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._envelope(obj, []), "usage": self.usage()}
