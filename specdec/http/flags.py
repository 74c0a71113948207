"""The HTTP API's flags, defined once (for `specdec serve`, `python -m orchestrator` and
`python -m specdec.http`), and its configuration. Light to import: no web stack."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from specdec.runtime.options import add_options, from_options, option
from specdec.runtime.server import MAX_CLIENT_MESSAGE_BYTES


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP API's settings; each field with `option` is also its flag."""

    endpoint: str = ""  # the orchestrator's gRPC address
    model_name: str = option("", "the model id HTTP clients name (default: the target model's name)",
                             flag="--served-model-name")
    tokenizer: str = ""  # model spec whose tokenizer (and chat template) to use; empty: the target's
    request_timeout_s: float = option(600.0, "deadline in seconds of one HTTP request's generation (then 504)",
                                      flag="--http-timeout")
    max_body_bytes: int = MAX_CLIENT_MESSAGE_BYTES  # as on gRPC; checked before parsing
    response_store_mb: int = option(256, "memory in MiB for the Responses API's stored responses (what "
                                    "previous_response_id goes on from; least recently used out); 0 = store none")
    response_ttl_s: float = option(86400.0, "with --redis-url: how long Redis keeps a stored response after its "
                                   "last use (the responses live there, shared by every HTTP server)")
    redis_url: str = ""  # the deployment's Redis (the orchestrator's --redis-url): stored responses go there


def add_http_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-port", type=int, default=-1,
                        help="serve the OpenAI-compatible HTTP API on this port (0 = any free port; default: off)")
    parser.add_argument("--http-host", default="", help="address for the HTTP API (default: the gRPC --host)")
    add_options(parser, HttpConfig)


def http_config(args: argparse.Namespace, endpoint: str, tokenizer: str = "", redis_url: str = "") -> HttpConfig:
    return from_options(HttpConfig, args, endpoint=endpoint, tokenizer=tokenizer, redis_url=redis_url)
