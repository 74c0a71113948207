"""Start the SpecDec server in this process."""

from __future__ import annotations

import argparse

from orchestrator.clients import draft_client, target_client
from orchestrator.servicer import OrchestratorConfig, SpecDecServicer
from protos import specdec_pb2_grpc as pb_grpc
from service_runtime.server import RunningServer, start_server
from specdec.models import load_tokenizer

READY_TIMEOUT_S = 60.0


def add_orchestrator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gamma-max", type=int, default=8, help="largest γ the adaptive policy or a client may use")
    parser.add_argument("--max-new-tokens-limit", type=int, default=8192)
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0 = off)")


def start_orchestrator(draft_address: str, target_address: str, tokenizer_spec: str, host: str, port: int,
                       args: argparse.Namespace) -> RunningServer:
    draft, target = draft_client(draft_address), target_client(target_address)
    draft.wait_ready(READY_TIMEOUT_S)
    target.wait_ready(READY_TIMEOUT_S)
    config = OrchestratorConfig(gamma_max=args.gamma_max, max_new_tokens_limit=args.max_new_tokens_limit)
    servicer = SpecDecServicer(draft, target, load_tokenizer(tokenizer_spec), config)
    return start_server(lambda server: pb_grpc.add_SpecDecServicer_to_server(servicer, server),
                        ["specdec.v1.SpecDec"], host, port)
