"""Drafting that overlaps verification, through gRPC on a real stack: hits, misses and losslessness.

The stack's draft is the target model itself, so with greedy decoding every draft is accepted and
every guess of the bonus token is right: branches hit unless a test forces them to miss. Its two
services are pinned to a CPU each, as `specdec bench --overlap-rtt` pins them to stand in for
separate machines.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from conftest import TINY_DRAFT, TINY_TARGET, tiny_stack

from orchestrator.sessions import DraftSession
from protos import specdec_pb2 as pb
from specdec.cli.client import generate, make_request
from specdec.cli.main import main
from specdec.launch.stack import EmbeddedStack

PROMPT = "The overlap test: while the target verifies, the draft"


CPUS = sorted(os.sched_getaffinity(0))
PINNED = dict(draft_cpus=str(CPUS[0]), target_cpus=str(CPUS[-1])) if len(CPUS) > 1 else {}


@pytest.fixture(scope="module")
def twin_stack():
    with EmbeddedStack(dataclasses.replace(tiny_stack().opts, draft_model=TINY_TARGET, **PINNED)) as running:
        yield running


@pytest.mark.skipif(not PINNED, reason="needs two CPUs")
def test_services_run_on_the_cpus_they_were_pinned_to(twin_stack):
    assert os.sched_getaffinity(twin_stack.draft.proc.pid) == {CPUS[0]}
    assert os.sched_getaffinity(twin_stack.target.proc.pid) == {CPUS[-1]}


def overlap_request(overlap: int, gamma: int | None = 3, **sampling) -> pb.GenerateRequest:
    request = make_request(prompt=PROMPT, max_new_tokens=48, gamma=gamma, **sampling)
    request.proposer, request.overlap = pb.PROPOSER_MODEL, overlap
    return request


def test_overlap_hits_and_greedy_output_equals_target_only(twin_stack):
    baseline = generate(twin_stack.endpoint, make_request(prompt=PROMPT, max_new_tokens=48, gamma=0))
    off = generate(twin_stack.endpoint, overlap_request(pb.OVERLAP_OFF))
    on = generate(twin_stack.endpoint, overlap_request(pb.OVERLAP_ON))
    assert off.token_ids == on.token_ids == baseline.token_ids
    assert off.stats["overlap_branches"] == 0 and not any(r.overlapped for r in off.rounds)
    branches, hits = on.stats["overlap_branches"], on.stats["overlap_hits"]
    assert branches >= 8 and hits >= 0.8 * branches, f"{hits} hits of {branches} branches with a perfect draft"
    prefetched = [r for r in on.rounds if r.prefetched]
    assert len(prefetched) == hits and all(r.drafted == r.accepted == 3 for r in prefetched)
    assert on.stats["rounds"] < 0.3 * len(baseline.token_ids)


def test_seeded_sampling_draws_the_same_tokens_with_and_without_overlap(twin_stack):
    """A hit's proposal is the one a fresh draft call would have made (same prefix, same positions of
    the draft's random stream), with its exact q, so a seeded run is reproduced token for token."""
    for seed in (1, 2):
        sampling = dict(temperature=0.8, top_k=20, seed=seed)
        off = generate(twin_stack.endpoint, overlap_request(pb.OVERLAP_OFF, **sampling))
        on = generate(twin_stack.endpoint, overlap_request(pb.OVERLAP_ON, **sampling))
        assert on.token_ids == off.token_ids, f"seed {seed}: overlap changed a sampled generation"
        assert on.stats["overlap_hits"] > 0


def test_a_forced_miss_drafts_again_and_changes_nothing(twin_stack, monkeypatch):
    """Every branch's guess of the bonus token made wrong: no branch is used, each round drafts anew,
    and the output is target-only's."""
    collect = DraftSession.collect

    def wrong_guess(self, branch):
        proposal, guess = collect(self, branch)
        return proposal, guess + 1

    monkeypatch.setattr(DraftSession, "collect", wrong_guess)  # the embedded orchestrator runs in this process
    baseline = generate(twin_stack.endpoint, make_request(prompt=PROMPT, max_new_tokens=48, gamma=0))
    missed = generate(twin_stack.endpoint, overlap_request(pb.OVERLAP_ON))
    assert missed.token_ids == baseline.token_ids
    assert missed.stats["overlap_branches"] >= 8 and missed.stats["overlap_hits"] == 0
    assert all(r.drafted == 3 and not r.prefetched for r in missed.rounds[1:-1])


def test_overlap_is_a_per_request_choice_and_refused_when_unknown(twin_stack):
    import grpc

    request = overlap_request(pb.OVERLAP_ON)
    request.overlap = 7
    with pytest.raises(grpc.RpcError) as info:
        generate(twin_stack.endpoint, request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "overlap" in info.value.details()


def test_overlap_bench_writes_rows_per_rtt_and_a_plot(tmp_path):
    output = tmp_path / "overlap.json"
    pinning = ["--draft-cpus", PINNED["draft_cpus"], "--target-cpus", PINNED["target_cpus"]] if PINNED else []
    assert main(["bench", "--overlap-rtt", "0,20", "--device", "cpu", "--draft-model", TINY_DRAFT, "--target-model",
                 TINY_TARGET, "--max-new-tokens", "12", "--limit-prompts", "2", *pinning,
                 "--output", str(output)]) == 0
    rows = json.loads(output.read_text())["rows"]
    assert [(r["rtt_ms"], r["config"]) for r in rows] == [
        (rtt, config) for rtt in (0.0, 20.0) for config in ("target-only", "hybrid", "hybrid+overlap", "hybrid+auto")]
    assert all(r["same_as_target_only"] and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["placement"].startswith("pinned" if PINNED else "co-located")
    assert output.with_suffix(".png").stat().st_size > 0
