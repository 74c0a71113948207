"""The HTTP API's flags, defined once (for `specdec serve`, `python -m orchestrator` and
`python -m specdec.http`), and its configuration. Light to import: no web stack."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from specdec.runtime.server import MAX_CLIENT_MESSAGE_BYTES


@dataclass(frozen=True)
class HttpConfig:
    endpoint: str  # the orchestrator's gRPC address
    model_name: str = ""  # the id clients name; empty: the target model the orchestrator reports
    tokenizer: str = ""  # model spec whose tokenizer (and chat template) to use; empty: the target's
    request_timeout_s: float = 600.0  # the Generate call's deadline
    max_body_bytes: int = MAX_CLIENT_MESSAGE_BYTES  # as on gRPC; checked before parsing


def add_http_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-port", type=int, default=-1,
                        help="serve the OpenAI-compatible HTTP API on this port (0 = any free port; default: off)")
    parser.add_argument("--http-host", default="", help="address for the HTTP API (default: the gRPC --host)")
    parser.add_argument("--served-model-name", default="",
                        help="the model id HTTP clients name (default: the target model's name)")
    parser.add_argument("--http-timeout", type=float, default=600.0,
                        help="deadline in seconds of one HTTP request's generation (then 504)")


def http_config(args: argparse.Namespace, endpoint: str, tokenizer: str = "") -> HttpConfig:
    return HttpConfig(endpoint=endpoint, model_name=args.served_model_name, tokenizer=tokenizer,
                      request_timeout_s=args.http_timeout)
