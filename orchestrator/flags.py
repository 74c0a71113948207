"""The orchestrator's flags, defined once, and their mapping to `OrchestratorConfig`.

Used by `python -m orchestrator` and by the `specdec` command, which starts an orchestrator in
its own process; nothing below the command line sees an argparse Namespace.
"""

from __future__ import annotations

import argparse
import os

from orchestrator.servicer import OrchestratorConfig


def add_orchestrator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gamma-max", type=int, default=8, help="largest γ the adaptive policy or a client may use")
    parser.add_argument("--max-new-tokens-limit", type=int, default=8192)
    parser.add_argument("--max-concurrent", type=int, default=64,
                        help="generations in flight; past it a request gets RESOURCE_EXHAUSTED at once")
    parser.add_argument("--round-timeout", type=float, default=300.0,
                        help="ceiling in seconds on one hop of one round; by default a hop gets 20x its measured "
                             "cost, at least 30 s (a draft past it is dropped, a target past it ends the stream)")
    parser.add_argument("--session-ttl", type=float, default=3600.0, help="seconds a resumable session record lives")
    parser.add_argument("--redis-url", default=os.environ.get("SPECDEC_REDIS_URL", ""),
                        help="Redis for draft discovery (when --draft is empty), resumable session records and "
                             "the shared γ prior (default: $SPECDEC_REDIS_URL; empty = none)")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0 = off)")
    parser.add_argument("--proposer", choices=("model", "ngram", "hybrid"), default=OrchestratorConfig.proposer,
                        help="who drafts when a request does not say: the draft model; prompt lookup (n-gram) in the "
                             "orchestrator, which needs no draft model; or hybrid, each round the one that pays more")
    parser.add_argument("--overlap", choices=("auto", "on", "off"), default=OrchestratorConfig.overlap,
                        help="draft the next round while the target verifies this one, when a request does not say: "
                             "auto = where the cost model says it pays (separate machines or cores), on, off")
    parser.add_argument("--lookup-memory", type=int, default=OrchestratorConfig.lookup_memory_tokens,
                        help="tokens of finished generations kept for n-gram lookups across sessions (0 = none)")


def orchestrator_config(args: argparse.Namespace) -> OrchestratorConfig:
    """The CLI flags of `add_orchestrator_args` as configuration."""
    return OrchestratorConfig(gamma_max=args.gamma_max, max_new_tokens_limit=args.max_new_tokens_limit,
                              max_concurrent=args.max_concurrent, round_timeout_s=args.round_timeout,
                              session_ttl_s=args.session_ttl, proposer=args.proposer,
                              overlap=args.overlap, lookup_memory_tokens=args.lookup_memory)
