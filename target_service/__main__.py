"""python -m target_service: host the target model behind specdec.v1.TargetService.

With `--tp N` (N > 1) this process is rank 0 of N: it starts ranks 1..N-1 as child processes
of the same command, shards the model over all of them and serves the one gRPC endpoint.
"""

import argparse
import dataclasses
import logging
import subprocess
import sys
from dataclasses import dataclass

import torch
from grpc_health.v1 import health_pb2

from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import resolve_device
from specdec.engine.tp import shard_model
from specdec.runtime.heap import freeze_startup_heap
from specdec.runtime.machine_lock import machine_lock
from specdec.runtime.model_service import load_and_profile, load_engine, measure_costs, serve_engine, setup_process
from specdec.runtime.model_service_config import (DRAFT_ONLY, ModelServiceConfig, model_service_config,
                                                  model_service_parser)
from specdec.runtime.options import add_options, from_options, option
from specdec.runtime.server import announce_and_wait, exit_now, free_port
from target_service import tensor_parallel as tp
from target_service.servicer import register

SERVICE = "specdec.v1.TargetService"
log = logging.getLogger("target_service")


def build_parser() -> argparse.ArgumentParser:
    parser = model_service_parser("target_service", "packaged:target", skip=DRAFT_ONLY)
    add_options(parser, TensorParallel)
    return parser


@dataclass(frozen=True)
class TensorParallel:
    """This process's place among the target's tensor-parallel ranks."""

    size: int = option(1, "tensor-parallel worker processes (one per GPU on CUDA)", flag="--tp")
    rank: int = option(0, "this process's rank (set for workers started elsewhere, e.g. by Ray; rank 0 sets it "
                          "for the workers it spawns)", flag="--tp-rank")
    master: str = option("", "HOST:PORT where the ranks rendezvous (default: rank 0 picks a free loopback port)",
                         flag="--tp-master")
    external_workers: bool = option(False, "rank 0 does not spawn ranks 1..N-1: they are started elsewhere with "
                                           "--tp-rank and the same --tp-master (Ray placement)",
                                    flag="--tp-external-workers")
    timeout_s: float = option(60.0, "seconds for the workers to rendezvous, and for any one collective to complete",
                              flag="--tp-timeout")
    load_timeout_s: float = option(1800.0, "seconds for every worker to finish loading its shard",
                                   flag="--tp-load-timeout")


def load_rank(config: ModelServiceConfig, parallel: TensorParallel) -> TargetEngine:
    device, rank, size = config.device, parallel.rank, parallel.size
    if size > 1 and resolve_device(device).type == "cuda":
        # One GPU per rank. Ranks spawned here see every GPU of the node; a rank placed by Ray sees
        # only its own (CUDA_VISIBLE_DEVICES), which is then device 0.
        device = f"cuda:{rank % torch.cuda.device_count()}"
    log.info("rank %d/%d: loading %s on %s", rank, size, config.model, device)
    # Activations are reduced on the default group: nccl on CUDA, gloo on CPU.
    shard = (lambda model: shard_model(model, rank, size)) if size > 1 else None
    return load_engine(config, TargetEngine, device, shard)


def run_tensor_parallel(config: ModelServiceConfig, parallel: TensorParallel, argv: list[str]) -> None:
    rank, world = parallel.rank, parallel.size
    device = resolve_device(config.device)
    followers: list[subprocess.Popen] = []
    if rank == 0 and not parallel.external_workers:
        parallel = dataclasses.replace(parallel, master=parallel.master or f"127.0.0.1:{free_port()}")
        followers = [subprocess.Popen([sys.executable, "-m", "target_service", *argv, "--tp-rank", str(r),
                                       "--tp-master", parallel.master], stdout=subprocess.DEVNULL)
                     for r in range(1, world)]
    if not parallel.master:
        raise SystemExit("target_service: --tp-master is needed with --tp-external-workers or --tp-rank > 0")
    try:
        group = tp.rendezvous(rank, world, parallel.master, device, parallel.timeout_s)
        engine = load_rank(config, parallel)
        log.info("rank %d/%d: shard holds %.0f MiB of weights", rank, world, engine.report(rank)["parameter_bytes"] / 2**20)
        tp.wait_for_ranks(group, parallel.load_timeout_s)
    except tp.StartupError as exc:
        for proc in followers:
            proc.kill()
        raise SystemExit(f"target_service: {exc}") from exc
    if rank > 0:
        freeze_startup_heap()
        tp.follow(engine, rank, group)
        engine.close()
        return
    front = tp.TensorParallelTarget(engine, group, world, followers)
    with machine_lock():  # rank 0 drives every rank's (collective) measurement
        measure_costs(front, config)
    running = serve_engine(front, config, SERVICE, register)

    def not_serving(_reason: str) -> None:
        for name in ("", SERVICE):
            running.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    front.on_failure.append(not_serving)
    announce_and_wait(running, f"target_service (tp={world})", on_stop=front.close,
                      drain_s=config.drain_timeout_s)
    for proc in followers:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    config, parallel = model_service_config(args), from_options(TensorParallel, args)
    if parallel.size < 1:
        raise SystemExit("--tp must be >= 1")
    installed = setup_process(config, "specdec-target", workers_per_node=parallel.size)
    try:
        if parallel.size == 1:
            engine = load_and_profile(config, lambda: load_rank(config, parallel), sharded=parallel.size > 1)
            announce_and_wait(serve_engine(engine, config, SERVICE, register), "target_service", on_stop=engine.close,
                              drain_s=config.drain_timeout_s)
        else:
            run_tensor_parallel(config, parallel, argv)
    finally:
        installed.shutdown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the interpreter's teardown (about a second)
