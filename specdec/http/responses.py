"""OpenAI response bodies from `GenerateResponse` messages: completions, chat, their stream chunks,
logprobs in both of OpenAI's shapes, and usage with the speculation figures as an extension."""

from __future__ import annotations

import functools
import time
import uuid

from protos import specdec_pb2 as pb
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


class Reply:
    """One request's identity and accumulated state: text, token logprobs and the final stats."""

    def __init__(self, kind: str, model: str, tokens: TokenText, top: int | None):
        self.kind, self.model, self.tokens, self.top = kind, model, tokens, top  # kind: "completion" | "chat"
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text_offset = 0  # completions: characters emitted so far
        self.stats: pb.GenerationStats | None = None

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    # -- logprobs ---------------------------------------------------------------
    def logprobs(self, message: pb.GenerateResponse) -> dict | None:
        if self.top is None:
            return None
        if self.kind == "chat":
            return {"content": [self._chat_entry(token, lp) for token, lp in zip(message.token_ids, message.logprobs)]}
        texts = [self.tokens.text(t) for t in message.token_ids]
        offsets = []
        for text in texts:
            offsets.append(self.text_offset)
            self.text_offset += len(text)
        return {"tokens": texts, "token_logprobs": [lp.logprob for lp in message.logprobs],
                "top_logprobs": [self._top_by_text(lp) for lp in message.logprobs],
                "text_offset": offsets}

    def _top_by_text(self, lp: pb.TokenLogprob) -> dict[str, float]:
        """The legacy shape: alternatives keyed by text; tokens that decode alike keep the likeliest."""
        top: dict[str, float] = {}
        for token, value in zip(lp.top_ids, lp.top_logprobs):
            top.setdefault(self.tokens.text(token), value)
        return top

    def _chat_entry(self, token: int, lp: pb.TokenLogprob) -> dict:
        entry = self._chat_token(token, lp.logprob)
        entry["top_logprobs"] = [self._chat_token(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs)]
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
        s = self.stats or pb.GenerationStats()
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated_tokens,
                "total_tokens": s.prompt_tokens + s.generated_tokens,
                "speculation": {"drafted": s.draft_tokens, "accepted": s.accepted_tokens,
                                "acceptance_rate": s.acceptance_rate, "mean_accepted_length": s.mean_accepted_length,
                                "rounds": s.rounds}}

    def finish_reason(self) -> str | None:
        return FINISH.get(self.stats.finish_reason) if self.stats is not None else None

    def whole(self, text: str, logprobs: dict | None) -> dict:
        """The non-streamed reply."""
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": self.finish_reason()}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.finish_reason()}
            body = self._envelope("text_completion", [choice])
        return {**body, "usage": self.usage()}

    def chunk(self, text: str, logprobs: dict | None, finish_reason: str | None = None, first: bool = False) -> dict:
        """One streamed chunk; the chat stream's first chunk names the role."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._envelope(obj, []), "usage": self.usage()}
