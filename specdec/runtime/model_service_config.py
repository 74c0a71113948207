"""A draft or target service's settings and flags, in a module without torch: a launcher (`specdec.launch`) and the
command line build services' arguments from them without importing the engines."""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.core.ngram import LOOKUP_MEMORY_TOKENS
from specdec.engine.defaults import (DRAFT_VOCAB_AUTO, DRAFT_WEIGHTS, GAMMA_LIMIT, PREFIX_CACHE_BYTES,
                                     SHARED_SLOWDOWN)
from specdec.engine.session_table import MAX_SESSIONS
from specdec.planning.controller import GAMMA_MAX
from specdec.runtime import security
from specdec.runtime.options import add_options, from_options, option
from specdec.runtime.security import Security, security_from_args
from specdec.runtime.server import ServerConfig

if TYPE_CHECKING:
    from specdec.engine.profile_cache import ProfileCache


@dataclass(frozen=True)
class ModelServiceConfig(ServerConfig):
    """A draft or target service's settings; each field with `option` is also its flag."""

    model: str = option("", "packaged:draft|packaged:target, a Hugging Face folder, a .gguf file, "
                            "synthetic:draft|target or tiny:... (the draft service also takes `lookup`: no model, "
                            "n-gram lookups)")
    security: Security = Security()
    device: str = option("auto", "auto (CUDA when present), cpu, cuda, cuda:N")
    dtype: str = option("auto", "auto (on CPU: gguf-q8 for a GGUF model, else fp32; bf16 on CUDA), float32, "
                                "bfloat16, float16, gguf (a GGUF model's own weight blocks, exact float32 "
                                "arithmetic), gguf-q8 (those blocks, 8-bit activations, integer dot products)")
    quantize: str = option("none", "int8: the fast, lossy CPU path (int8 weights, per-token int8 activations; "
                                   "see docs/PERFORMANCE.md)", choices=("none", "int8"))
    runner: str = option("auto", "auto (static on CUDA, ragged on CPU), ragged (any shape, per-session caches) or "
                                 "static (a preallocated KV pool, fixed shapes, CUDA graphs on a GPU)",
                         choices=("auto", "ragged", "static"))
    context: int = option(0, "with the static runner: positions per session in its KV pool (0 = min(model's, 4096))")
    profile_tokens: int = option(GAMMA_MAX + 1, "at start-up, time forwards of 1..N new tokens (the cost profile the "
                                                "γ controller plans with; γ_max + 1)")
    grammar_warmup: str = option("startup", "build the grammars' view of the tokenizer (about 3 s for a 152k "
                                            "vocabulary) at start-up, after the cost profile, so that the first "
                                            "structured output does not wait for it; off: the first one builds it",
                                 choices=("startup", "off"))
    profile_cache: str = option("auto", "folder that keeps measured cost profiles (and gguf-q8's one-row setting) per "
                                        "model, path and CPU, so a restart does not re-time them; auto = profiles/ in the weights cache, off = "
                                        "measure every start (default: $SPECDEC_PROFILE_CACHE or auto)",
                                env="SPECDEC_PROFILE_CACHE")
    max_sessions: int = option(MAX_SESSIONS, "live sessions before RESOURCE_EXHAUSTED")
    gamma_max: int = option(GAMMA_LIMIT, "largest γ accepted per round", deprecated=("--max-gamma",))
    prefix_cache_mb: int = option(PREFIX_CACHE_BYTES >> 20, "MiB of ended sessions' KV caches kept for later sessions "
                                  "whose tokens start the same way (a chat's next turn, a shared system prompt), "
                                  "which then compute only the rest; 0 = off. On row-invariant paths only, where "
                                  "it changes no output. With the static runner kept caches hold pool slots until "
                                  "a new session needs one")
    prompt_slowdown: float = option(SHARED_SLOWDOWN, "beside sessions that are decoding, a prompt goes in chunks that "
                                    "keep each shared pass within this many times their pass alone (priced by the cost "
                                    "profile): they keep at least about 1/N of their speed while it goes in; larger "
                                    "feeds a long prompt faster and them slower (at least 1)")
    threads: int = option(0, "torch intra-op threads (0 = torch default)")
    redis_url: str = option("", "register this replica in Redis with TTL heartbeats (default: $SPECDEC_REDIS_URL)",
                            env="SPECDEC_REDIS_URL")
    advertise: str = option("", "HOST:PORT other services reach this replica at (default: this host name and port)",
                            env="SPECDEC_ADVERTISE")
    heartbeat_ttl_s: float = option(6.0, "seconds a registration outlives its last heartbeat (beats every ttl/3)",
                                    flag="--heartbeat-ttl")
    lookup_memory_tokens: int = option(LOOKUP_MEMORY_TOKENS, "with --model lookup: tokens of ended sessions kept for "
                                                             "lookups across sessions", flag="--lookup-memory")
    draft_vocab: int = option(-1, "the draft's output layer scores only token ids below N and the end-of-sequence "
                                  "ids (proposals never pick the others; output stays lossless); -1 = auto "
                                  f"({DRAFT_VOCAB_AUTO} for vocabularies of more than twice that, on the gguf-q8 "
                                  "path), 0 = every id")
    draft_weights: str = option("auto", "the draft's linear layers as its GGUF file ships them, or requantized at load "
                                        "to 4-bit Q4_0 (fewer bytes a step; a proposal's law may be any law, so the "
                                        "output stays lossless); auto = q4_0 on the gguf-q8 path",
                                choices=DRAFT_WEIGHTS)

    def cost_profile_cache(self) -> ProfileCache | None:
        from specdec.engine.profile_cache import ProfileCache  # torch's: this module stays without it

        if self.profile_cache == "off":
            return None
        if self.profile_cache == "auto":
            from specdec.weights import cache_root

            return ProfileCache(cache_root() / "profiles")
        return ProfileCache(Path(self.profile_cache))

    def advertised_address(self, port: int) -> str:
        if self.advertise:
            return self.advertise
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "[::]") else self.host
        return f"{host}:{port}"


# The registry, lookup memory, and the draft's output layer and weight format.
DRAFT_ONLY = ("redis_url", "advertise", "heartbeat_ttl_s", "lookup_memory_tokens", "draft_vocab", "draft_weights")


def model_service_parser(what: str, default_model: str, skip=()) -> argparse.ArgumentParser:
    """`ModelServiceConfig`'s flags (but `skip`), with `default_model`, and the security flags."""
    parser = argparse.ArgumentParser(prog=f"python -m {what}", description=f"specdec {what}")
    add_options(parser, ModelServiceConfig, skip=skip, defaults={"model": default_model})
    security.add_security_args(parser)
    return parser


def model_service_config(args: argparse.Namespace) -> ModelServiceConfig:
    """The flags of `model_service_parser` as configuration."""
    return from_options(ModelServiceConfig, args, security=security_from_args(args))
