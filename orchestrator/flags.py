"""The orchestrator's flags: `OrchestratorConfig`'s options, and the process's own (Redis, metrics).

Used by `python -m orchestrator` and by the `specdec` command, which starts an orchestrator in
its own process; nothing below the command line sees an argparse Namespace.
"""

from __future__ import annotations

import argparse
import os

from orchestrator.servicer import OrchestratorConfig
from specdec.runtime.options import add_options, from_options


def add_orchestrator_args(parser: argparse.ArgumentParser) -> None:
    add_options(parser, OrchestratorConfig)
    parser.add_argument("--redis-url", default=os.environ.get("SPECDEC_REDIS_URL", ""),
                        help="Redis for draft discovery (when --draft is empty), resumable session records and "
                             "the shared γ prior (default: $SPECDEC_REDIS_URL; empty = none)")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0 = off)")


def orchestrator_config(args: argparse.Namespace) -> OrchestratorConfig:
    """The CLI flags of `add_orchestrator_args` as configuration."""
    return from_options(OrchestratorConfig, args)
