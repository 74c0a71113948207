"""The model-free proposer (`specdec.core.ngram`): against a brute-force search, and through the services."""

from __future__ import annotations

import dataclasses
import random

import grpc
import pytest
from conftest import tiny_options

from orchestrator.lookups import LOOKUP_KINDS, Lookups
from orchestrator.server import start_orchestrator
from orchestrator.servicer import OrchestratorConfig
from protos import specdec_pb2 as pb
from specdec.cli.client import generate, make_request
from specdec.core.ngram import Lookup, LookupProposer, NgramIndex, Prediction, RecentSequences
from specdec.launch.stack import EmbeddedStack
from specdec.planning.prior import LookupPrior


def brute_force(tokens: list[int], gamma: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """The longest suffix (max_n down to min_n) with an earlier occurrence; the last such occurrence's continuation."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # occurrences that end before the sequence does
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + gamma], n
    return [], 0


@pytest.mark.parametrize("seed", range(5))
def test_lookup_equals_brute_force_as_the_sequence_grows(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(300)]  # a small alphabet: many repeats
    index = NgramIndex(min_n=1, max_n=4)
    for end in range(1, len(tokens) + 1, 7):
        index.sync(tokens[:end])
        lookup = index.propose(5)
        assert (lookup.tokens, lookup.match) == brute_force(tokens[:end], 5, 1, 4)


@pytest.mark.parametrize("seed", range(3))
def test_a_rollback_leaves_the_index_a_fresh_one_would_build(seed):
    """A service's commit may replace a tail it holds (a rejected branch): the index then forgets it."""
    rng = random.Random(seed)
    tokens = [rng.randrange(5) for _ in range(200)]
    index = NgramIndex(min_n=1, max_n=4)
    for end in range(10, len(tokens), 13):
        index.sync(tokens[:end] + [rng.randrange(5) for _ in range(rng.randrange(1, 6))])  # a speculative tail
        index.sync(tokens[:end])  # the commit that replaced it
        fresh = NgramIndex(min_n=1, max_n=4)
        fresh.sync(tokens[:end])
        assert index.tokens == fresh.tokens and index._after == fresh._after
        assert index.propose(5) == fresh.propose(5)


def test_recent_sequences_serve_later_sessions_within_their_capacity():
    shared = RecentSequences(capacity=40, min_n=2, max_n=4)
    first = LookupProposer(2, 4, shared)
    answer = [10, 11, 12, 13, 14, 15, 16, 17]
    first.sync([1, 2, 3] + answer)
    shared.add(first.index.tokens)  # the session finished
    second = LookupProposer(2, 4, shared)
    second.sync([7, 8, 1, 2, 3])  # a new prompt that ends like the first session's
    found = second.propose(4)
    assert (found.tokens, found.match, found.source, found.frequency) == ([10, 11, 12, 13], 3, "shared", 1)
    second.sync([7, 8, 1, 2, 3, 10, 11])
    assert second.propose(2).tokens == [12, 13]
    shared.add([9, 1, 2, 3, 10, 20])  # the context (1, 2, 3) recurs: its continuation is the latest one
    third = LookupProposer(2, 4, shared)
    third.sync([6, 1, 2, 3])
    found = third.propose(4)
    assert (found.tokens, found.frequency, found.kind) == ([10, 20], 2, ("shared", 3, True))
    for filler in range(3):  # 3 × 15 tokens: the first session's sequence is evicted
        shared.add([100 + filler] * 15)
    assert LookupProposer(2, 4, shared).propose(4).tokens == []
    fresh = LookupProposer(2, 4, shared)
    fresh.sync([5, 1, 2, 3])
    assert fresh.propose(4).tokens == [] and shared._size <= 40
    assert all(count > 0 for count in shared._seen.values())


def test_the_longer_match_wins_between_own_and_shared():
    shared = RecentSequences(capacity=100, min_n=2, max_n=4)
    shared.add([1, 2, 3, 4, 50, 51])
    own = LookupProposer(2, 4, shared)
    own.sync([3, 4, 60, 61, 9, 2, 3, 4])  # its own sequence matches (3, 4) only; the shared one (2, 3, 4)
    found = own.propose(2)
    assert (found.tokens, found.match, found.source) == ([50, 51], 3, "shared")
    own.sync([3, 4, 60, 61, 9, 2, 3, 4, 50, 9, 2, 3, 4])  # now its own holds (9, 2, 3, 4)
    assert own.propose(2) == dataclasses.replace(own.index.propose(2)) and own.propose(2).source == "self"


def test_an_edit_copies_the_prompt():
    prompt = "def area(r):\n    return 3.14 * r * r\n\n# the same, renamed\ndef"
    tokens = [ord(c) for c in prompt]
    index = NgramIndex(min_n=2, max_n=4)
    index.sync(tokens + [ord(" "), ord("a")])  # the output so far: " a"
    lookup = index.propose(6)
    assert lookup.match == 4 and bytes(lookup.tokens).decode() == "rea(r)"


def test_no_match_proposes_nothing():
    index = NgramIndex(min_n=2, max_n=3)
    index.sync([1, 2, 3, 4, 5])
    assert index.propose(4).tokens == [] and index.propose(4).match == 0
    with pytest.raises(ValueError):
        NgramIndex(min_n=0)


def test_a_prediction_is_followed_from_its_start_and_found_again_after_an_edit():
    """Before any output, the prediction's start; while the output follows it, what comes next (reported as
    the aligned match, max_n + 1); after one token replaced, what follows it; after a longer edit, the longest
    suffix found again, at the occurrence nearest after where the output was (not an earlier repeat), and
    followed from there; at its end, nothing."""
    prompt = [90, 91, 92]
    predicted = [1, 2, 3, 7, 8, 1, 2, 3, 4, 5, 6]  # "1 2 3" twice
    follow = Prediction(predicted, len(prompt), 2, 4)
    assert (follow.propose(prompt, 3).tokens, follow.propose(prompt, 3).match) == ([1, 2, 3], 5)
    out = prompt + [1, 2, 3, 7, 8, 1]
    assert (follow.propose(out, 2).tokens, follow.propose(out, 2).match, follow.propose(out, 2).source) == \
        ([2, 3], 5, "prediction")
    edited = out + [2, 3, 99, 2, 3]  # the output leaves the prediction, then writes "2 3" again
    found = follow.propose(edited, 3)
    assert (found.tokens, found.match) == ([4, 5, 6], 2), "the later '2 3', nearest after the last place"
    assert follow.propose(edited + [4, 5], 3).tokens == [6] and follow.propose(edited + [4, 5, 6], 3).tokens == []
    replaced = Prediction(predicted, len(prompt), 2, 4)
    assert (replaced.propose(prompt + [1, 2, 42], 3).tokens, replaced.propose(prompt + [1, 2, 42], 3).match) == \
        ([7, 8, 1], 6), "one token replaced: followed after it (reported as max_n + 2)"
    assert (replaced.propose(prompt + [1, 2, 42, 7], 3).tokens, replaced.propose(prompt + [1, 2, 42, 7], 3).match) == \
        ([8, 1, 2], 5), "and in step again once the output goes on with it"
    lost = Prediction(predicted, len(prompt), 2, 4)
    assert lost.propose(prompt + [50, 51], 3).tokens == [], "off the prediction and no suffix in it"
    assert lost.propose(prompt + [50, 51, 7, 8], 2).tokens == [1, 2]
    assert lost.propose(prompt, 2) == Lookup([1, 2], 5, "prediction"), "the committed tokens cut back: from the start"


def test_a_prediction_wins_a_tie_with_the_sequences_own_lookup():
    prediction = Prediction([5, 6, 7, 8, 9], 4, 2, 4)
    proposer = LookupProposer(2, 4, None, prediction)
    proposer.sync([5, 6, 40, 41, 5, 6])  # the output so far "5 6": its own index and the prediction match (5, 6)
    found = proposer.propose(2)
    assert (found.tokens, found.source) == ([7, 8], "prediction") and proposer.index.propose(2).tokens == [40, 41]


# -- through the services ----------------------------------------------------------------------
REPEATING = "def area(r):\n    return 3.14 * r * r\n\n" * 3 + "def area(r):\n"


def _ngram_request(gamma, prompt: str = REPEATING, n: int = 48):
    request = make_request(prompt=prompt, max_new_tokens=n, gamma=gamma)
    request.proposer = pb.PROPOSER_NGRAM
    return request


def test_ngram_greedy_output_equals_target_only_per_request(stack):
    """The same server answers a model request and a lookup request; both equal target-only."""
    baseline = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=0))
    model = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=3, proposer="model"))
    assert model.token_ids == baseline.token_ids
    for gamma in (3, None):
        lookup = generate(stack.endpoint, _ngram_request(gamma))
        assert lookup.token_ids == baseline.token_ids, f"ngram γ={gamma} diverged from target-only"
        assert lookup.stats["draft_replica"] == "", "a lookup round used the draft service"
        hybrid = _ngram_request(gamma)
        hybrid.proposer = pb.PROPOSER_HYBRID
        assert generate(stack.endpoint, hybrid).token_ids == baseline.token_ids, f"hybrid γ={gamma} diverged"
    fixed = generate(stack.endpoint, _ngram_request(3))
    assert fixed.stats["draft_tokens"] > 0, "the lookup never proposed on a prompt that repeats itself"
    assert {r.proposer for r in fixed.rounds if r.drafted} == {"ngram"}
    assert {r.proposer for r in model.rounds if r.drafted} == {"model"}


def test_the_default_is_hybrid_with_overlap_where_it_pays(stack):
    """An orchestrator on its defaults (the test stack's pins the draft model) drafts by the model where no
    lookup finds anything (a request whose answer is not in its prompt) and by lookup where one does (the same
    request again: its answer is in the orchestrator's recent sequences), and its output is target-only's."""
    assert (OrchestratorConfig.proposer, OrchestratorConfig.overlap) == ("hybrid", "auto")
    running = start_orchestrator(stack.draft_address, stack.target_address, "tiny:seed=0", "127.0.0.1", 0,
                                 OrchestratorConfig(gamma_max=6))
    prompt = "a prompt asked twice, whose answer is not in it"
    try:
        endpoint = f"127.0.0.1:{running.port}"
        baseline = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=0))
        first, again = (generate(endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=3)) for _ in range(2))
    finally:
        running.stop(0)
    assert first.token_ids == baseline.token_ids and again.token_ids == baseline.token_ids

    def accepted(result, proposer: str) -> int:
        return sum(r.accepted for r in result.rounds if r.proposer == proposer)

    assert accepted(first, "model") > 0 and accepted(first, "ngram") == 0
    assert accepted(again, "ngram") >= 24, [(r.proposer, r.drafted, r.accepted) for r in again.rounds]


def test_an_orchestrator_with_no_draft_service_drafts_by_lookup(stack):
    """`--proposer ngram` and no draft replica: lookups still speculate; a model request decodes
    target-only. Both give target-only's output."""
    config = OrchestratorConfig(gamma_max=6, max_new_tokens_limit=1024, proposer="ngram")
    running = start_orchestrator("", stack.target_address, "tiny:seed=0", "127.0.0.1", 0, config)
    try:
        endpoint = f"127.0.0.1:{running.port}"
        baseline = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=0))
        by_default = generate(endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=3))
        assert by_default.token_ids == baseline.token_ids and by_default.stats["draft_tokens"] > 0
        model = make_request(prompt=REPEATING, max_new_tokens=48, gamma=3)
        model.proposer = pb.PROPOSER_MODEL  # with no replica to ask
        without = generate(endpoint, model)
        assert without.token_ids == baseline.token_ids and without.stats["draft_tokens"] == 0
    finally:
        running.stop(0)


def test_a_repeated_request_is_looked_up_in_the_first_ones_output(stack):
    """Lookups across sessions: every finished generation's sequence stays in the orchestrator's
    recent sequences, so the second time a prompt is asked, lookups propose whole runs of its answer.
    An orchestrator that keeps none looks up in the request's own tokens only."""
    prompt = "a prompt asked twice, whose answer is not in it"
    request = make_request(prompt=prompt, max_new_tokens=48, gamma=6, proposer="ngram")
    forgetful = start_orchestrator("", stack.target_address, "tiny:seed=0", "127.0.0.1", 0,
                                   OrchestratorConfig(gamma_max=6, proposer="ngram", lookup_memory_tokens=0))
    try:
        baseline = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=0))
        again = generate(stack.endpoint, request)
        alone = generate(f"127.0.0.1:{forgetful.port}", request)
    finally:
        forgetful.stop(0)
    assert again.token_ids == alone.token_ids == baseline.token_ids
    shared = [r for r in again.rounds if r.proposer == "ngram"]
    assert again.stats["rounds"] <= len(baseline.token_ids) / 5 and sum(r.accepted for r in shared) >= 36
    assert alone.stats["rounds"] > again.stats["rounds"]


def test_a_predicted_output_changes_the_speed_and_nothing_else(stack):
    """GenerateRequest.prediction_token_ids (OpenAI's Predicted Outputs): greedy output equals target-only's
    with the output itself as the prediction (drafted from nearly whole, in a few rounds), with an edited copy
    (a run of it rejected, the rest found again) and at γ = 0 (ignored); a model proposer uses it too, on its
    first find whatever the measured costs (`Lookups.priced`: a busy machine's noisy verify cost, 2.8× a step,
    once priced it out; CI caught it). The
    stats count its accepted and rejected tokens. Salted: no other session's sequence is looked up. The counts
    are checked at a fixed γ with prompt lookup, where no measured cost picks the rounds' lengths."""
    def run(prediction: list[int], gamma: int | None = None, proposer: str = "model", salt: str = "prediction"):
        request = make_request(prompt="a prompt whose answer the client predicts", max_new_tokens=48, gamma=gamma,
                               proposer=proposer)
        request.prediction_token_ids.extend(prediction)
        request.cache_salt = salt
        return generate(stack.endpoint, request)

    base = run([], gamma=0)
    edited = [7 if i % 10 == 5 else t for i, t in enumerate(base.token_ids)]  # every tenth token replaced
    exact, followed = (run(prediction, gamma=6, proposer="ngram", salt=f"fixed-{i}")
                       for i, prediction in enumerate((base.token_ids, edited)))
    assert exact.token_ids == followed.token_ids == base.token_ids
    assert (exact.stats["prediction_accepted_tokens"], exact.stats["rounds"]) == (41, 7), exact.stats  # 7 a round
    assert followed.stats["prediction_rejected_tokens"] > 0 and followed.stats["prediction_accepted_tokens"] >= 30
    for prediction in (base.token_ids, edited):  # adaptive γ, and the draft model beside the prediction
        hybrid = run(prediction, salt=f"model-{prediction is edited}")
        assert hybrid.token_ids == base.token_ids and hybrid.stats["prediction_accepted_tokens"] > 0
        assert (hybrid.stats["prediction_rejected_tokens"] > 0) == (prediction is edited)
    plain = run(base.token_ids, gamma=0)
    assert plain.token_ids == base.token_ids and plain.stats["draft_tokens"] == 0
    for field, value, message in [("prediction_token_ids", [10**6], "prediction_token_ids outside the vocabulary"),
                                  ("prediction", "x" * 600, "prediction has 600 tokens")]:
        request = make_request(prompt="x", max_new_tokens=4)
        getattr(request, field).extend(value) if isinstance(value, list) else setattr(request, field, value)
        with pytest.raises(grpc.RpcError) as caught:
            generate(stack.endpoint, request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()


def test_rounds_that_find_nothing_double_until_a_lookup_finds_something():
    """`Lookups.quiet_steps`: after 1, 2, 3, ... rounds in a row whose lookup found nothing, a target-only
    round takes 1, 2, 4, ... steps, at most the chunk; a lookup that finds something starts the count again."""
    lookups = Lookups(0, [], None, LookupPrior(LOOKUP_KINDS), None, with_model=False)
    committed = [1, 2, 3, 4, 5, 6, 7]
    steps = []
    for _ in range(5):
        lookups.sync(committed)
        assert not lookups.propose(4).tokens
        steps.append(lookups.quiet_steps(8))
        committed.append(committed[-1] + 1)
    assert steps == [1, 2, 4, 8, 8]
    committed += [2, 3]  # "2 3" occurred before: "4 5 6 7" follows it
    lookups.sync(committed)
    assert lookups.propose(4).tokens == [4, 5, 6, 7]
    lookups.sync(committed + [100])  # a token never seen: nothing follows it
    assert not lookups.propose(4).tokens and lookups.quiet_steps(8) == 1


def test_a_stack_with_no_draft_model_at_all():
    """`specdec serve --proposer ngram --draft-replicas 0`: no draft service is started; greedy output
    still equals target-only, and the lookup speculates."""
    opts = tiny_options(orchestrator=dict(proposer="ngram"), draft_replicas=0)
    with pytest.raises(ValueError, match="lookup only"):
        EmbeddedStack(tiny_options(draft_replicas=0)).start()
    with EmbeddedStack(opts) as stack:
        assert stack.drafts == [] and stack.draft is None
        baseline = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48, gamma=0))
        lookup = generate(stack.endpoint, make_request(prompt=REPEATING, max_new_tokens=48))
        assert lookup.token_ids == baseline.token_ids
        looked_up = [r for r in lookup.rounds if r.proposer == "ngram"]
        assert looked_up and sum(r.accepted for r in looked_up) > 0, "the lookup never proposed an accepted token"
        assert all(r.proposer in ("ngram", "") for r in lookup.rounds)



def test_a_salted_request_neither_looks_up_nor_leaves_other_sessions_sequences(stack):
    """A tenant's request (`cache_salt`) looks up in its own tokens only: asked after the same prompt's unsalted
    answer, and again after itself, it takes as many rounds as an orchestrator without memory would, where an
    unsalted repeat takes whole runs of the remembered answer."""
    prompt = "a salted prompt asked again and again, whose answer is not in it"
    baseline = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=0))
    again = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=6, proposer="ngram"))
    salted = make_request(prompt=prompt, max_new_tokens=48, gamma=6, proposer="ngram")
    salted.cache_salt = "tenant"
    first, second = generate(stack.endpoint, salted), generate(stack.endpoint, salted)
    assert first.token_ids == second.token_ids == again.token_ids == baseline.token_ids
    assert first.stats["rounds"] == second.stats["rounds"] > again.stats["rounds"]


def test_a_lookup_not_proposed_is_learned_from_the_tokens_the_round_committed():
    """Hybrid learns a lookup kind's α from rounds that found it but drafted with the model: its tokens up to the
    first that differs from the committed ones count as accepted, a differing token as the rejection, and
    tokens past the round's are not counted (the next round may still accept them)."""
    from orchestrator.draft_pool import DraftPool
    from orchestrator.generation import Generation
    from orchestrator.request import GenerationRequest
    from specdec.core.params import SamplingParams
    from specdec.planning.controller import GammaController
    from specdec.planning.cost import CostProfile

    request = GenerationRequest([5, 6], 8, SamplingParams(), gamma=None, proposer="hybrid")
    generation = Generation(request, DraftPool([]), None, None, frozenset(), 64, GammaController(4, CostProfile((0.1, 0.1))))
    kind = ("self", 3, False)
    lookups = generation.lookups
    estimate = lookups.acceptance[kind]
    for proposal, committed, counted in [([1, 2, 3], [1, 2, 9, 4], (2, 1)), ([1, 2, 3], [1, 2], (4, 1)),
                                         ([1, 2], [1, 2, 3], (6, 1)), ([7], [8], (6, 2))]:
        lookups.shadow = Lookup(proposal, 3)
        lookups.observe_shadow(committed)
        assert (estimate.accepted, estimate.rejections) == counted, (proposal, committed)
    lookups.observe_shadow([1, 2, 3])
    assert (estimate.accepted, estimate.rejections) == (6, 2), "a shadow is observed once"


def test_an_untried_lookup_kind_is_tried_short_then_priced_at_its_alpha():
    """Hybrid tries a kind no session has proposed at an α as high as an estimate gives, so that it is tried,
    but with at most `UNTRIED_TOKENS` of its match: a miss of 8 grows every session's pass by 8 rows. Once
    tried, a kind's lookups go as long as its learned α pays for."""
    from orchestrator.lookups import UNTRIED_TOKENS
    from specdec.planning.controller import GammaController
    from specdec.planning.cost import CostProfile

    cheap = GammaController(8, CostProfile(tuple(0.01 * (1 + 0.01 * s) for s in range(9))))
    text = list(range(100, 140))
    prior = LookupPrior(LOOKUP_KINDS)
    lookups = Lookups(0, [], None, prior, cheap, with_model=True)
    lookups.sync(text + text[:4])  # the last 4 tokens occurred before: prompt lookup finds what followed them
    _, first = lookups.priced(8)
    assert prior.untried(first.kind) and first.tokens == text[4:4 + UNTRIED_TOKENS]
    lookups.proposed(first)
    lookups.observe(first, len(first.tokens), len(first.tokens))
    for _ in range(20):
        lookups.acceptance[first.kind].observe(8, 8)
    assert lookups.priced(8)[1].tokens == text[4:12], "tried and learned: as long as it pays"


def test_a_prediction_is_tried_on_its_first_find_whatever_the_verify_costs():
    """`Lookups.priced` where a verify of several tokens costs 3× a target step (a noisy measurement on a busy
    machine), so that no lookup at its prior α pays: a client's prediction is still proposed whole on its first
    find in a generation (its α is this request's alone); once proposed, it is priced like any lookup."""
    from specdec.planning.controller import GammaController
    from specdec.planning.cost import CostProfile

    costly = GammaController(6, CostProfile((0.01, 0.03, 0.031, 0.032, 0.033, 0.034, 0.035)))
    output, prompt = list(range(100, 130)), [1, 2, 3]
    lookups = Lookups(len(prompt), output, None, LookupPrior(LOOKUP_KINDS), costly, with_model=True)
    lookups.sync(prompt)
    rate, first = lookups.priced(6)
    assert rate == float("inf") and first.tokens == output[:6] and first.source == "prediction"
    assert lookups.priced(6)[0] == float("inf"), "found, not proposed: still untried"
    lookups.proposed(first)
    lookups.sync(prompt + output[:7])  # its verdict not observed: its kind's α stays the prior's
    assert lookups.priced(6) is None, "then priced at its α, which loses to this verify cost"
