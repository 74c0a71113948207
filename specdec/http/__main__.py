"""python -m specdec.http: the OpenAI-compatible HTTP API in front of a running orchestrator."""

from __future__ import annotations

import argparse
import os

from specdec.http.flags import add_http_args, http_config
from specdec.http.server import start_http
from specdec.runtime import security, telemetry
from specdec.runtime.options import add_options
from specdec.runtime.server import ServerConfig, announce_and_wait, configure_logging, exit_now

DEFAULT_PORT = 8000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdec.http", description="OpenAI-compatible HTTP API for specdec")
    parser.add_argument("--endpoint", required=True, help="the orchestrator's gRPC address HOST:PORT")
    parser.add_argument("--tokenizer", default="", help="model spec whose tokenizer and chat template to use "
                                                        "(default: the target model the orchestrator reports)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--redis-url", default=os.environ.get("SPECDEC_REDIS_URL", ""),
                        help="Redis for the Responses API's stored responses, shared with every HTTP server that "
                             "names it (default: $SPECDEC_REDIS_URL; empty = this process's memory)")
    add_options(parser, ServerConfig, only=("drain_timeout_s",))
    add_http_args(parser)
    security.add_security_args(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    security.use(security.security_from_args(args))
    installed = telemetry.configure("specdec-http", prometheus=True)  # for GET /metrics
    port = DEFAULT_PORT if args.http_port < 0 else args.http_port
    config = http_config(args, args.endpoint, args.tokenizer, args.redis_url)
    running = start_http(config, args.http_host or "0.0.0.0", port, args.log_level.lower())
    announce_and_wait(running, "http api", on_stop=installed.shutdown, drain_s=args.drain_timeout_s)


if __name__ == "__main__":
    main()
    exit_now()  # skip the interpreter's teardown (about a second)
