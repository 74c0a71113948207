"""python -m orchestrator: the client-facing SpecDec server, in front of running draft and target services."""

from __future__ import annotations

import argparse

from orchestrator.flags import add_orchestrator_args, orchestrator_config
from orchestrator.server import start_orchestrator
from service_runtime import security, telemetry
from service_runtime.server import add_common_args, announce_and_wait, configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator", description="specdec orchestrator")
    add_common_args(parser)
    parser.add_argument("--draft", default="", help="draft replicas HOST:PORT[,HOST:PORT...]; empty: the replicas "
                                                   "registered in Redis (--redis-url)")
    parser.add_argument("--target", required=True, help="target service address HOST:PORT")
    parser.add_argument("--tokenizer", default="packaged:target", help="model spec whose tokenizer to use")
    add_orchestrator_args(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.draft and not args.redis_url:
        parser.error("give --draft addresses, or --redis-url to find the registered draft replicas")
    configure_logging(args.log_level)
    security.use(security.security_from_args(args))
    installed = telemetry.configure("specdec-orchestrator", args.otlp_endpoint, args.trace_file, args.metrics_port,
                                    args.host)
    running = start_orchestrator(args.draft, args.target, args.tokenizer, args.host, args.port,
                                 orchestrator_config(args), args.redis_url, args.health_port)
    announce_and_wait(running, "orchestrator", on_stop=installed.shutdown)


if __name__ == "__main__":
    main()
