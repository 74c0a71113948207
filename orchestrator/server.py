"""Start the SpecDec server in this process."""

from __future__ import annotations

import argparse
import os

from orchestrator.clients import draft_client, target_client
from orchestrator.draft_pool import DraftPool
from orchestrator.servicer import OrchestratorConfig, SpecDecServicer
from protos import specdec_pb2_grpc as pb_grpc
from service_runtime.redis_state import connect
from service_runtime.server import RunningServer, start_server
from specdec.models import load_tokenizer

READY_TIMEOUT_S = 60.0


def add_orchestrator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gamma-max", type=int, default=8, help="largest γ the adaptive policy or a client may use")
    parser.add_argument("--max-new-tokens-limit", type=int, default=8192)
    parser.add_argument("--redis-url", default=os.environ.get("SPECDEC_REDIS_URL", ""),
                        help="Redis for draft discovery (when --draft is empty), resumable session records and "
                             "the shared γ prior (default: $SPECDEC_REDIS_URL; empty = none)")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0 = off)")


def start_orchestrator(draft_addresses: str, target_address: str, tokenizer_spec: str, host: str, port: int,
                       args: argparse.Namespace) -> RunningServer:
    """`draft_addresses`: comma-separated replicas; empty with `args.redis_url` = the replicas registered there."""
    redis_url = getattr(args, "redis_url", "")
    client = connect(redis_url) if redis_url else None
    addresses = [a for a in draft_addresses.split(",") if a]
    drafts = DraftPool(addresses, registry=None if addresses else client)
    for address in addresses:
        probe = draft_client(address)
        probe.wait_ready(READY_TIMEOUT_S)
        probe.close()
    target = target_client(target_address)
    target.wait_ready(READY_TIMEOUT_S)
    config = OrchestratorConfig(gamma_max=args.gamma_max, max_new_tokens_limit=args.max_new_tokens_limit)
    servicer = SpecDecServicer(drafts, target, load_tokenizer(tokenizer_spec), config, redis=client)
    return start_server(lambda server: pb_grpc.add_SpecDecServicer_to_server(servicer, server),
                        ["specdec.v1.SpecDec"], host, port)
