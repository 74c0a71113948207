"""Ray placement on a local Ray instance: the draft replica and both tensor-parallel ranks of the
target run as Ray actors in placement groups, and greedy output matches target-only decoding."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from conftest import assert_speculated, tiny_options

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.runtime.server import free_port

RAY = [sys.executable, "-m", "ray.scripts.scripts"]


def _start_local_ray(env: dict) -> str:
    """A local Ray head started as a process of its own (as `ray start` is in a deployment); its address.

    Not `ray.init()` here: that forks Ray's head processes from this test process, whose gRPC threads
    (from earlier tests) make a forked child crash now and then. A start that misses Ray's fixed
    start-up wait on a busy machine is retried from scratch."""
    port = free_port()
    for attempt in range(3):
        run = subprocess.run([*RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                              f"--object-store-memory={100 * 2**20}", "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=300)
        if run.returncode == 0:
            return f"127.0.0.1:{port}"
        subprocess.run([*RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)
    raise RuntimeError(f"ray start failed 3 times:\n{run.stderr[-3000:]}")


@pytest.fixture(scope="module")
def ray_stack():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    env = {**os.environ, "RAY_worker_niceness": "0"}  # the services are the workload: normal priority
    address = _start_local_ray(env)
    import ray

    from specdec.launch.ray_stack import RayStack

    opts = tiny_options(target_tp=2)
    try:
        with RayStack(opts, address, draft_replicas=1, cpus_per_process=0.5,
                      ray_init={"log_to_driver": False}) as running:
            yield running, ray
    finally:
        ray.shutdown()
        subprocess.run([*RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_ray_placed_services_generate_like_target_only(stack, ray_stack):
    running, ray = ray_stack
    groups = ray.util.placement_group_table()
    assert sum(g["state"] == "CREATED" for g in groups.values()) == 2  # drafts (SPREAD), target ranks (STRICT_PACK)
    # Services on the driver's own node are reached over loopback.
    assert running.target_address.startswith("127.0.0.1:") and running.draft_addresses[0].startswith("127.0.0.1:")
    with grpc.insecure_channel(running.target_address) as channel:
        info = pb_grpc.TargetServiceStub(channel).Info(pb.ModelInfoRequest(), timeout=30)
    assert info.tensor_parallel_size == 2 and len({r.pid for r in info.ranks}) == 2
    actor_pids = set(ray.get([a.pid.remote() for a in running.actors]))
    assert {r.pid for r in info.ranks} <= actor_pids, "both ranks run under Ray actors"
    for prompt in ("def ray():", "placement groups"):
        reference = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=40, gamma=0)).token_ids
        for gamma in (3, None):
            out = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=40, gamma=gamma))
            assert out.token_ids == reference, (prompt, gamma)
            if gamma is not None:  # adaptive γ may rightly choose 0 on a busy machine and draft nothing
                assert_speculated(out, f"at γ={gamma} on {prompt!r}")
                assert out.stats["draft_replica"] == running.draft_addresses[0]
