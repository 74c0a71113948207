"""A draft service started without a model (`--model lookup`): n-gram lookups behind DraftService."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import tiny_stack

from orchestrator.clients import draft_client, target_client
from specdec.cli.client import generate, make_request
from specdec.engine.lookup_engine import LOOKUP_MODEL
from specdec.launch.stack import EmbeddedStack

REPEATING = "def area(r):\n    return 3.14 * r * r\n\n" * 3 + "def area(r):\n"


def lookup_replica_stack() -> EmbeddedStack:
    return EmbeddedStack(dataclasses.replace(tiny_stack().opts, draft_model=LOOKUP_MODEL))


@pytest.fixture(scope="module")
def lookup_stack():
    with lookup_replica_stack() as running:
        yield running


def test_it_describes_itself_as_a_model_of_any_vocabulary(lookup_stack):
    info = draft_client(lookup_stack.draft_address).info()
    assert (info.model, info.vocab_size, info.compute_path, info.kernel) == (LOOKUP_MODEL, 0, "lookup", "ngram")
    # Its "forward" is a lookup: cheaper than the tiny target's one-token forward measured in the same stack.
    target = target_client(lookup_stack.target_address).info()
    assert len(info.forward_ns) == 7 and max(info.forward_ns) < target.forward_ns[0]


def greedy_speculates_as_target_only(stack: EmbeddedStack, gamma: int | None) -> None:
    """The same prompt, target-only then at `gamma`: the same tokens, and the replica's lookups drafted some."""
    baseline = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=0))
    looked_up = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=gamma))
    assert looked_up.token_ids == baseline.token_ids
    assert looked_up.stats["draft_tokens"] > 0 and looked_up.stats["draft_replica"] == stack.draft_address
    assert {r.proposer for r in looked_up.rounds if r.drafted} == {"model"}  # to the orchestrator, a draft replica


def test_greedy_output_equals_target_only_at_a_fixed_gamma(lookup_stack):
    greedy_speculates_as_target_only(lookup_stack, 3)


def test_adaptive_gamma_speculates_from_an_untried_replica():
    """On a stack of its own: no session has measured the replica's α, and an α never measured is worth its
    first probe whatever the measured costs say, so adaptive γ drafts within 48 tokens on any machine at any
    load. (After a session that learned α near 0, as the fixed-γ one does on this prompt, a probe waits until
    it is cheap enough, which a loaded machine's timings can put past 48 tokens.)"""
    with lookup_replica_stack() as running:
        greedy_speculates_as_target_only(running, None)


def test_sampled_and_overlapped_generations_complete(lookup_stack):
    """Its proposals are point masses (no q): the target's sampler takes them at any temperature, and a
    branch drafted during a verify is a lookup too."""
    sampled = generate(lookup_stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=32, temperature=0.8,
                                                           top_k=20, seed=4, gamma=3))
    assert len(sampled.token_ids) == 32 and sampled.stats["draft_tokens"] > 0
    baseline = generate(lookup_stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=0))
    overlapped = generate(lookup_stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=3,
                                                              overlap="on"))
    assert overlapped.token_ids == baseline.token_ids and overlapped.stats["overlap_branches"] > 0


def test_a_finished_session_serves_the_next_one_on_the_replica(lookup_stack):
    """A session's tokens join the replica's recent sequences when it ends: the same request again is
    proposed from them, whole runs at a time."""
    prompt = "asked of the lookup replica twice"
    first = generate(lookup_stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=6))
    again = generate(lookup_stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=6))
    assert again.token_ids == first.token_ids
    assert again.stats["rounds"] <= len(first.token_ids) / 5 < first.stats["rounds"]
