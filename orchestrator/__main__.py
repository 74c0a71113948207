"""python -m orchestrator: the client-facing SpecDec server, in front of running draft and target services."""

from __future__ import annotations

import argparse

from orchestrator.flags import add_orchestrator_args, orchestrator_config
from orchestrator.server import start_orchestrator
from specdec.http.flags import add_http_args, http_config
from specdec.runtime import security, telemetry
from specdec.runtime.options import from_options
from specdec.runtime.server import ServerConfig, add_server_args, announce_and_wait, configure_logging, exit_now


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator", description="specdec orchestrator")
    add_server_args(parser)
    parser.add_argument("--draft", default="", help="draft replicas HOST:PORT[,HOST:PORT...]; empty: the replicas "
                                                   "registered in Redis (--redis-url)")
    parser.add_argument("--target", required=True, help="target service address HOST:PORT")
    parser.add_argument("--tokenizer", default="packaged:target", help="model spec whose tokenizer to use")
    add_orchestrator_args(parser)
    add_http_args(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.draft and not args.redis_url and args.proposer == "model":
        parser.error("give --draft addresses, or --redis-url to find the registered draft replicas, "
                     "or --proposer ngram or hybrid to draft without a draft model")
    server = from_options(ServerConfig, args)
    configure_logging(server.log_level)
    security.use(security.security_from_args(args))
    serve_http = args.http_port >= 0
    installed = telemetry.configure("specdec-orchestrator", server.otlp_endpoint, server.trace_file, args.metrics_port,
                                    server.host, prometheus=serve_http)
    running = start_orchestrator(args.draft, args.target, args.tokenizer, server.host, server.port,
                                 orchestrator_config(args), args.redis_url, server.health_port,
                                 server.keepalive_s)
    http = None
    if serve_http:  # the OpenAI API beside it, a client of its gRPC port over loopback
        from specdec.http.server import start_http

        http = start_http(http_config(args, f"127.0.0.1:{running.port}", args.tokenizer, args.redis_url),
                          args.http_host or server.host, args.http_port, server.log_level.lower())

    def stop() -> None:
        if http is not None:
            http.stop()
        installed.shutdown()

    announce_and_wait(running, "orchestrator", on_stop=stop, drain_s=server.drain_timeout_s)


if __name__ == "__main__":
    main()
    exit_now()  # skip the interpreter's teardown (about a second)
