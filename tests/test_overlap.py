"""Drafting that overlaps verification, through gRPC on a real stack: hits, misses and losslessness.

The stack's draft is the target model itself, so with greedy decoding every draft is accepted and
every guess of the bonus token is right: branches hit unless a test forces them to miss. Its two
services are pinned to a CPU each, as `specdec bench --overlap-rtt` pins them to stand in for
separate machines.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading

import pytest
from conftest import TINY_DRAFT, TINY_TARGET, tiny_stack, wait_until

from orchestrator.clients import PendingCall
from orchestrator.sessions import DraftSession
from protos import specdec_pb2 as pb
from specdec.cli.client import generate, make_request
from specdec.cli.main import main
from specdec.launch.stack import EmbeddedStack
from specdec.planning.prior import SharedPrior

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


@pytest.fixture(scope="module")
def confident_twins():
    """As `twin_stack`, the draft as sure of each token as the target (their logits scaled alike): under adaptive
    γ it drafts on past the guess where an unsure one stops after it."""
    confident = "tiny:seed=0,logit_scale=50"
    options = dataclasses.replace(tiny_stack().opts, draft_model=confident, target_model=confident, **PINNED)
    with EmbeddedStack(options) as running:
        yield running


def adaptive_request(overlap: int, prompt_ids: list[int], max_new_tokens: int = 48) -> pb.GenerateRequest:
    request = make_request(prompt_token_ids=prompt_ids, max_new_tokens=max_new_tokens)
    request.proposer, request.overlap = pb.PROPOSER_MODEL, overlap
    return request


PROMPT_IDS = list(range(40, 120))


def feed_lands(monkeypatch, after_looks: int | None) -> None:
    """When the reply to a draft call looks in (the orchestrator runs in this process): after `after_looks` looks
    at it, as a long prompt's feed on a draft of its own; None: at the first look, waited for, as a short one."""
    looks, ready = iter(range(10**9)), PendingCall.ready

    def landed(self) -> bool:
        if after_looks is None:
            wait_until(lambda: ready(self), 30, "the draft's reply")
            return True
        return next(looks) >= after_looks and ready(self)

    monkeypatch.setattr(PendingCall, "ready", landed)


def drafting_pays(stack: EmbeddedStack, monkeypatch, **learned: float) -> None:
    """The orchestrator's sessions start from a prior (the orchestrator runs in this process) by which the draft
    is cheap (a twentieth of its profile) and accepted (α 0.99), so that steady drafting pays, and from the
    `learned` estimates given (`GammaController.LEARNED`)."""
    servicer = stack.orchestrator.servicer
    prior = SharedPrior(servicer.gamma_max)
    prior.load({"learned": {"draft_scale": 0.05, **learned}, "alpha": {"greedy": 0.99}})
    monkeypatch.setattr(servicer, "prior", prior)


def test_a_feed_ahead_beside_the_prompts_round_lets_the_next_round_draft_at_once(confident_twins, monkeypatch):
    """Under adaptive γ the prompt's round decodes target-only; with overlap on, the draft feeds the prompt beside
    it and drafts the next round after a guess of its token, which a perfect draft gets right: where the feed is
    in by the next round, that round's proposal is ready, no catch-up paid."""
    baseline = generate(confident_twins.endpoint, make_request(prompt_token_ids=PROMPT_IDS, max_new_tokens=48,
                                                               gamma=0))
    off = generate(confident_twins.endpoint, adaptive_request(pb.OVERLAP_OFF, PROMPT_IDS))
    feed_lands(monkeypatch, None)
    on = generate(confident_twins.endpoint, adaptive_request(pb.OVERLAP_ON, PROMPT_IDS))
    assert on.token_ids == off.token_ids == baseline.token_ids
    assert on.rounds[0].drafted == 0 and on.rounds[0].overlapped, "the prompt's round: target-only, the draft beside"
    assert on.rounds[1].prefetched and on.rounds[1].drafted > 0 and on.rounds[1].accepted == on.rounds[1].drafted
    assert not off.rounds[0].overlapped and not off.rounds[1].prefetched


def test_rounds_go_on_without_the_draft_while_its_feed_is_under_way(confident_twins, monkeypatch):
    """A feed ahead is never waited for: until its reply is in, rounds decode target-only, and the draft model
    drafts once it is, the committed tokens past the prompt its only catch-up."""
    baseline = generate(confident_twins.endpoint, make_request(prompt_token_ids=PROMPT_IDS, max_new_tokens=96,
                                                               gamma=0))
    drafting_pays(confident_twins, monkeypatch)
    feed_lands(monkeypatch, 20)
    on = generate(confident_twins.endpoint, adaptive_request(pb.OVERLAP_ON, PROMPT_IDS, max_new_tokens=96))
    assert on.token_ids == baseline.token_ids
    assert on.rounds[1].overlapped and on.rounds[1].drafted == 0, "the round after the prompt's: beside the feed"
    beside = list(itertools.takewhile(lambda r: r.overlapped and not r.drafted, on.rounds[1:]))
    assert 1 + len(beside) < len(on.rounds), "rounds went on beside the feed until it landed"
    assert any(r.proposer == "model" for r in on.rounds[1 + len(beside):]), "the draft model drafts once it is in"


def test_a_feed_under_way_when_the_reply_ends_is_kept_for_the_next_turn(confident_twins, monkeypatch):
    """A reply that ends while the draft still feeds its prompt leaves the feed to finish: the draft replica then
    keeps the prompt, and the conversation's next turn takes it from its cache instead of feeding it again."""
    feed_lands(monkeypatch, 10**8)
    prompt = [7, *PROMPT_IDS]
    first = generate(confident_twins.endpoint, adaptive_request(pb.OVERLAP_ON, prompt, max_new_tokens=6))
    assert not any(r.drafted for r in first.rounds)
    wait_until(lambda: not any(t.name == "draft-feed" for t in threading.enumerate()), 30, "the feed to end")
    monkeypatch.undo()
    turn = make_request(prompt_token_ids=[*prompt, *first.token_ids, 11, 12], max_new_tokens=8, gamma=2)
    turn.proposer = pb.PROPOSER_MODEL
    second = generate(confident_twins.endpoint, turn)
    assert second.stats["draft_cached_tokens"] >= len(prompt)


def test_auto_feeds_ahead_only_where_the_draft_was_measured_to_run_apart(confident_twins, monkeypatch):
    """On auto the prompt's round feeds the draft beside it once both services' slowdowns beside each other were
    measured small (`GammaController.runs_apart`): not before any was measured, nor where they share cores."""
    def feeds_ahead(**kappas) -> bool:
        drafting_pays(confident_twins, monkeypatch, **kappas)
        result = generate(confident_twins.endpoint, adaptive_request(pb.OVERLAP_AUTO, PROMPT_IDS, max_new_tokens=12))
        return result.rounds[0].overlapped

    assert not feeds_ahead()
    assert not feeds_ahead(contention_target=1.8, contention_draft=2.0)
    assert feeds_ahead(contention_target=1.05, contention_draft=1.2)


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
