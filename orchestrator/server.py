"""Start the SpecDec server in this process."""

from __future__ import annotations

import logging
import threading

import grpc
from grpc_health.v1 import health_pb2

from orchestrator.clients import ServiceClient, draft_client, target_client
from orchestrator.draft_pool import ROUTE_MIN_TOKENS, DraftPool
from orchestrator.servicer import OrchestratorConfig, SpecDecServicer
from protos import specdec_pb2_grpc as pb_grpc
from specdec import weights
from specdec.runtime.redis_state import SharedRoutes, connect
from specdec.runtime.server import KEEPALIVE_S, MAX_CLIENT_MESSAGE_BYTES, RunningServer, start_server
from specdec.weights.sources import load_tokenizer

READY_TIMEOUT_S = 60.0
SERVICE_NAME = "specdec.v1.SpecDec"
log = logging.getLogger(__name__)


def watch_target(target: ServiceClient, running: RunningServer, period_s: float = 1.0) -> None:
    """The orchestrator's health follows its target: NOT_SERVING while no target is reachable.

    A thread checks the channel every `period_s` (a channel to a dead peer goes idle rather than
    failing, so the check asks it to connect).
    """
    def watch() -> None:
        last = None
        while not running.stopped.wait(period_s):
            try:
                grpc.channel_ready_future(target.channel).result(timeout=period_s)
                status = health_pb2.HealthCheckResponse.SERVING
            except grpc.FutureTimeoutError:
                status = health_pb2.HealthCheckResponse.NOT_SERVING
            if status != last:
                if last is not None:
                    log.warning("target %s is %s", target.address, health_pb2.HealthCheckResponse.ServingStatus.Name(status))
                for name in ("", SERVICE_NAME):
                    running.health.set(name, status)
                last = status

    threading.Thread(target=watch, daemon=True, name="target-watch").start()


def start_orchestrator(draft_addresses: str, target_address: str, tokenizer_spec: str, host: str, port: int,
                       config: OrchestratorConfig, redis_url: str = "", health_port: int = 0,
                       keepalive_s: float = KEEPALIVE_S, tokenizer=None) -> RunningServer:
    """`draft_addresses`: comma-separated replicas; empty with `redis_url` = the replicas registered there.
    `tokenizer`: the one of `tokenizer_spec`, loaded already (`specdec.weights.sources.preload_tokenizer`)."""
    client = connect(redis_url) if redis_url else None
    addresses = [a for a in draft_addresses.split(",") if a]
    if not addresses and client is None and config.proposer == "model":
        raise ValueError("give draft replica addresses or a Redis registry, "
                         "or draft by lookup (proposer ngram or hybrid)")
    routes = SharedRoutes(client, ROUTE_MIN_TOKENS) if client is not None else None
    drafts = DraftPool(addresses, registry=None if addresses else client, routes=routes, keepalive_s=keepalive_s)
    for address in addresses:
        probe = draft_client(address)
        probe.wait_ready(READY_TIMEOUT_S)
        probe.close()
    target = target_client(target_address, keepalive_s)
    target.wait_ready(READY_TIMEOUT_S)
    if tokenizer is None:
        tokenizer = load_tokenizer(weights.resolve(tokenizer_spec))
    servicer = SpecDecServicer(drafts, target, tokenizer, config, redis=client)
    running = start_server(lambda server: pb_grpc.add_SpecDecServicer_to_server(servicer, server), [SERVICE_NAME],
                           host, port, max_concurrent=config.max_concurrent, max_receive_bytes=MAX_CLIENT_MESSAGE_BYTES,
                           health_port=health_port, keepalive_s=keepalive_s)
    watch_target(target, running)
    servicer.activity.stopping = running.stopped.is_set  # a feed after a reply ends as the server stops
    running.servicer = servicer
    return running
