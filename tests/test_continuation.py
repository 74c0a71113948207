"""Target-only steps after a verify in the same call (`specdec.engine.continuation`): the tokens, their
log-probabilities and the caches are what one step a call gives, greedy and sampled."""

from __future__ import annotations

import pytest
from conftest import TINY_TARGET, tiny_options

from specdec.cli.client import generate, make_request
from specdec.core.errors import InvalidArgument
from specdec.core.params import SamplingParams
from specdec.engine.continuation import MAX_EXTRA_STEPS, verify_and_continue
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model
from specdec.launch.stack import EmbeddedStack
from specdec.planning.controller import GammaController
from specdec.weights.sources import build_byte_tokenizer

PROMPT = [40, 41, 42, 43, 7, 99]


@pytest.fixture(scope="module")
def target():
    with TargetEngine(load_model(TINY_TARGET, device="cpu")) as engine:
        yield engine


def one_step_a_call(engine, session: str, prompt: list[int], steps: int, top: int | None):
    """What the orchestrator gets with one step a round: each call commits the token before it."""
    tokens, logprobs, start, new = [], [], 0, prompt
    for _ in range(steps):
        result = engine.verify(session, start, new, [], None, top)
        start, new = start + len(new), result.verdict.tokens
        tokens += new
        logprobs += result.logprobs or []
    return tokens, logprobs


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, top_k=40, seed=7)],
                         ids=["greedy", "sampled"])
def test_extra_steps_give_what_one_step_a_call_gives(target, params):
    target.open("alone", params)
    target.open("chunked", params)
    expected, expected_logprobs = one_step_a_call(target, "alone", PROMPT, 7, top=3)
    result = verify_and_continue(target, "chunked", 0, PROMPT, [], None, 3, extra_steps=6)
    assert result.verdict.tokens == expected and result.passes == 7
    assert result.logprobs == expected_logprobs
    assert result.load.forward_s > 0 and result.compute_s >= result.load.forward_s
    # The next call (the orchestrator's next round) commits all seven; the caches agree from there.
    follow = target.verify("chunked", len(PROMPT), expected, [], None)
    alone = target.verify("alone", len(PROMPT) + 6, expected[-1:], [], None)
    assert follow.verdict.tokens == alone.verdict.tokens
    target.release("alone")
    target.release("chunked")


def test_extra_steps_end_after_a_stop_id_or_at_the_context(target):
    target.open("s", SamplingParams())
    expected, _ = one_step_a_call(target, "s", PROMPT, 8, top=None)
    target.release("s")
    target.open("s", SamplingParams())
    stopped = verify_and_continue(target, "s", 0, PROMPT, [], None, None, 7, frozenset({expected[2]}))
    assert stopped.verdict.tokens == expected[:expected.index(expected[2]) + 1]
    target.release("s")

    context = target.loaded.max_context
    long_prompt = [(5 * i) % 200 + 3 for i in range(context - 3)]
    target.open("s", SamplingParams())
    result = verify_and_continue(target, "s", 0, long_prompt, [], None, None, MAX_EXTRA_STEPS)
    assert len(result.verdict.tokens) == 3 and result.passes == 3, "steps past the context"
    target.release("s")
    with pytest.raises(InvalidArgument, match="extra_steps"):
        verify_and_continue(target, "s", 0, PROMPT, [], None, None, MAX_EXTRA_STEPS + 1)


@pytest.fixture(scope="module")
def chunked_stack():
    """Target-only rounds take up to a second of steps each: as many as the limits allow, however slow
    the machine."""
    with EmbeddedStack(tiny_options(orchestrator=dict(target_chunk_ms=1000.0))) as running:
        yield running


def test_target_only_rounds_take_several_steps_through_the_services(chunked_stack):
    endpoint = chunked_stack.endpoint
    prompt = "def fibonacci(n):"
    plain = generate(endpoint, make_request(prompt, max_new_tokens=40, gamma=0, top_logprobs=2))
    spec = generate(endpoint, make_request(prompt, max_new_tokens=40, gamma=2, top_logprobs=2))
    assert plain.token_ids == spec.token_ids and len(plain.token_ids) == 40
    assert plain.logprobs == spec.logprobs and len(plain.logprobs) == 40
    rounds = [(r.emitted, r.target_passes) for r in plain.rounds if r.emitted]
    assert rounds == [(1, 1), (17, 17), (17, 17), (5, 5)], "the prompt's round streams its first token at once"
    assert 1 + MAX_EXTRA_STEPS == 17


def test_a_stop_string_inside_a_round_of_several_tokens_ends_the_tokens_there(chunked_stack):
    """The text ends before the stop string, and the tokens (and their count) at the one that completes it."""
    endpoint = chunked_stack.endpoint
    full = generate(endpoint, make_request("abc", max_new_tokens=40, gamma=0))
    stop = full.text[20:22]
    cut = generate(endpoint, make_request("abc", max_new_tokens=40, gamma=0, stop=[stop], top_logprobs=1))
    assert cut.stats["finish_reason"] == "stop" and cut.text == full.text[:full.text.find(stop)]
    tokenizer = build_byte_tokenizer()
    kept = next(n for n in range(1, 41) if stop in tokenizer.decode(full.token_ids[:n]))
    assert cut.token_ids == full.token_ids[:kept] and len(cut.logprobs) == kept < 40
    assert sum(r.emitted for r in cut.rounds) == kept and cut.stats["generated_tokens"] == kept


@pytest.mark.parametrize("proposer", ["model", "hybrid"])
def test_adaptive_target_only_rounds_take_several_steps(proposer):
    """A draft that never agrees and costs more than the target: adaptive γ settles at target-only rounds
    of several steps (probes aside), and its output is target-only's. Adaptive runs first: target-only's
    output would be a lookup's match."""
    options = tiny_options(draft="tiny:seed=7,layers=6", orchestrator=dict(target_chunk_ms=1000.0, proposer=proposer))
    with EmbeddedStack(options) as running:
        prompt = "def fibonacci(n):"
        adaptive = generate(running.endpoint, make_request(prompt, max_new_tokens=80, top_logprobs=1))
        plain = generate(running.endpoint, make_request(prompt, max_new_tokens=80, gamma=0, top_logprobs=1))
    assert adaptive.token_ids == plain.token_ids and adaptive.logprobs == plain.logprobs
    rounds = adaptive.rounds[1:]  # after the prompt's
    assert any(r.drafted for r in rounds), "the untried draft is measured first"
    chunked = [r.target_passes for r in rounds if not r.drafted and r.target_passes > 1]
    assert chunked and sum(chunked) > 40, [(r.gamma, r.drafted, r.target_passes) for r in rounds]
    assert all(r.target_passes == 1 for r in rounds if r.drafted)


def test_prompt_lookup_rounds_that_find_nothing_grow():
    """Prompt lookup under adaptive γ, on an output with nothing to copy: each round whose lookup finds
    nothing takes 2^(misses in a row − 1) target steps (up to the chunk) in one hop (`Lookups.quiet_steps`;
    the reset at a match: test_ngram), and the output is target-only's. At a GPU's speed one step a round
    cost 1.45× a token."""
    options = tiny_options(orchestrator=dict(target_chunk_ms=1000.0, proposer="ngram"))
    with EmbeddedStack(options) as running:
        request = make_request("x = [1, 2, 3]", max_new_tokens=80)
        request.cache_salt = "alone"  # no earlier session's sequence is looked up
        adaptive = generate(running.endpoint, request)
        plain = generate(running.endpoint, make_request("x = [1, 2, 3]", max_new_tokens=80, gamma=0))
    assert adaptive.token_ids == plain.token_ids
    steps = [r.target_passes for r in adaptive.rounds]
    assert not any(r.drafted for r in adaptive.rounds) and steps[:6] == [1, 2, 4, 8, 16, 17], steps
    assert sum(steps) == 80 and max(steps) == MAX_EXTRA_STEPS + 1, steps


def test_the_controller_is_told_what_the_draft_must_feed_before_it_drafts(monkeypatch):
    """Each adaptive round's γ is chosen knowing the tokens the draft model feeds first (`choose(unseen=…)`,
    which a probe pays for): after a round it drafted 1 (its first pass then feeds its last draft and the
    bonus token, which the controller prices itself), else one more than the tokens committed since it was
    last sent any, the prompt's included. A draft that never agrees and costs more than the target, so that
    target-only rounds follow its first measurement. The controller is also told the tokens emitted so far."""
    told = []  # per round: what `choose` was told, None where the round was settled without it
    generated = []  # per chosen round: the tokens emitted before it, as the controller was told
    choose, settled = GammaController.choose, GammaController.settled

    def spy(self, max_useful=None, unseen=1):
        told.append(unseen)
        generated.append(self.generated)
        return choose(self, max_useful, unseen)

    def settled_spy(self, *args, **kwargs):
        if answer := settled(self, *args, **kwargs):
            told.append(None)
        return answer

    monkeypatch.setattr(GammaController, "choose", spy)  # the embedded orchestrator runs in this process
    monkeypatch.setattr(GammaController, "settled", settled_spy)
    options = tiny_options(draft="tiny:seed=7,layers=6", orchestrator=dict(target_chunk_ms=1000.0))
    with EmbeddedStack(options) as running:
        prompt = "def fibonacci(n):"
        adaptive = generate(running.endpoint, make_request(prompt, max_new_tokens=80))
    rounds = adaptive.rounds
    # The prompt's round is target-only, chosen by nobody; the draft then has the prompt and its tokens to feed.
    behind = adaptive.stats["prompt_tokens"] + rounds[0].emitted  # committed tokens the draft has not been sent
    assert not rounds[0].drafted and len(told) == len(rounds) - 1 and told[0] == behind + 1
    assert any(r.drafted for r in rounds) and any(not r.drafted and r.target_passes > 1 for r in rounds)
    for record, now in zip(rounds[1:], told[1:]):
        behind = record.emitted + (0 if record.drafted else behind)
        assert now in (None, 1 if record.drafted else behind + 1), told
    emitted = [sum(r.emitted for r in rounds[:i]) for i, now in enumerate(told, 1) if now is not None]
    assert generated == emitted, "how long the generation has run: the draft's feed is spread over as much"
