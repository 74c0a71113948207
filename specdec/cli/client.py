"""A small Python client for SpecDec.Generate, used by the CLI, the benchmark and the tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from google.protobuf.json_format import MessageToDict

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.runtime.security import open_channel
from specdec.runtime.server import CHANNEL_OPTIONS
from specdec.runtime.wire import logprob_request_to_pb, speculation_to_pb


@dataclass
class GenerateResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    rounds: list[pb.RoundStats] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)  # one per token, when asked for
    # When asked for: the prompt's tokens, and their log-probabilities from the second on
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    first_token_s: float = 0.0  # from the call to the first message with tokens
    seconds: float = 0.0  # from the call to the end of the stream

    def to_json(self) -> dict:
        rounds = [MessageToDict(r, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                  for r in self.rounds]
        out = {"text": self.text, "token_ids": self.token_ids, "stats": self.stats, "rounds": rounds}
        if self.logprobs:
            out["logprobs"] = [{"token_id": token, "logprob": lp.logprob,
                                "top": [[t, v] for t, v in zip(lp.top_ids, lp.top_logprobs)]}
                               for token, lp in zip(self.token_ids, self.logprobs)]
        return out


def stats_to_dict(stats: pb.GenerationStats) -> dict:
    """GenerationStats as JSON-ready data, with the finish reason as a word ("stop", "length", ...)."""
    out = MessageToDict(stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    out["finish_reason"] = pb.FinishReason.Name(stats.finish_reason).removeprefix("FINISH_REASON_").lower()
    return out


def make_request(prompt: str = "", prompt_token_ids: list[int] | None = None, max_new_tokens: int = 64,
                 temperature: float = 0.0, top_k: int = 0, top_p: float | None = None, seed: int = 0,
                 gamma: int | None = None, stop: list[str] | None = None,
                 top_logprobs: int | None = None, proposer: str = "", overlap: str = "",
                 prompt_top: int | None = None, sampler: str = "") -> pb.GenerateRequest:
    """`top_logprobs`: None = no log-probabilities; k = each token's, with k alternatives; `prompt_top` the same
    for the prompt's tokens (one k serves both).
    `proposer` ("model", "ngram", "hybrid"), `overlap` ("auto", "on", "off") and `sampler` ("coupled",
    "rejection"): "" = the server's default."""
    request = pb.GenerateRequest(prompt=prompt, prompt_token_ids=prompt_token_ids or [], max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_k=top_k, seed=seed, stop=stop or [],
                                 **logprob_request_to_pb(top_logprobs, prompt_top),
                                 **speculation_to_pb(proposer, overlap, sampler))
    if top_p is not None:
        request.top_p = top_p
    if gamma is not None:
        request.gamma = gamma
    return request


def generate(endpoint: str, request: pb.GenerateRequest, on_text: Callable[[str], None] | None = None,
             timeout: float | None = None) -> GenerateResult:
    """Run one generation to the end; `on_text` receives each text delta as it arrives."""
    began = time.perf_counter()
    with open_channel(endpoint, CHANNEL_OPTIONS) as channel:
        result = GenerateResult()
        for response in pb_grpc.SpecDecStub(channel).Generate(request, timeout=timeout):
            if response.token_ids and not result.token_ids:
                result.first_token_s = time.perf_counter() - began
            result.token_ids.extend(response.token_ids)
            result.text += response.text
            result.rounds.append(response.round)
            result.logprobs.extend(response.logprobs)
            result.prompt_token_ids.extend(response.prompt_token_ids)
            result.prompt_logprobs.extend(response.prompt_logprobs)
            if on_text and response.text:
                on_text(response.text)
            if response.HasField("stats"):
                result.stats = stats_to_dict(response.stats)
        result.seconds = time.perf_counter() - began
        return result
