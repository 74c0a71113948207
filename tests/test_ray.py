"""Ray placement on a local Ray instance: the draft replica and both tensor-parallel ranks of the
target run as Ray actors in placement groups, and greedy output matches target-only decoding."""

from __future__ import annotations

import os

import grpc
import pytest

from cli.client import generate, make_request
from launch.stack import StackOptions
from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc

from conftest import TINY_DRAFT, TINY_TARGET


@pytest.fixture(scope="module")
def ray_stack():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from launch.ray_stack import RayStack

    opts = StackOptions(draft_model=TINY_DRAFT, target_model=TINY_TARGET, device="cpu", gamma_max=6,
                        log_level="warning", target_tp=2)
    init = dict(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False)
    with RayStack(opts, draft_replicas=1, cpus_per_process=0.5, ray_init=init) as running:
        yield running, ray
    ray.shutdown()


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
        assert out.stats["draft_replica"] == running.draft_addresses[0]
