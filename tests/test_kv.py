"""KV bookkeeping and rollback: after a rejected round, each engine's logits equal a fresh forward pass."""

import pytest
import torch

from specdec.core.errors import InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from specdec.core.params import SamplingParams
from specdec.core.sequence import SequenceState
from specdec.engine.draft_engine import DraftEngine
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import build_tiny_model, load_model

TARGET, DRAFT = "tiny:seed=0", "tiny:seed=0,perturb=0.05"


def test_commit_keeps_matching_prefix():
    state = SequenceState()
    assert state.commit(0, [1, 2, 3]) == 0
    state.extend([4, 5, 6], cached=5)  # three drafts, two of them fed
    # Accepted 4, rejected 5 -> recovered 9: the cache keeps prompt + 4.
    assert state.commit(3, [4, 9]) == 4
    assert state.pending() == [9]


def test_replayed_commit_is_idempotent():
    state = SequenceState()
    state.commit(0, [1, 2, 3])
    state.extend([4], cached=4)
    first = (state.commit(3, [4, 5]), list(state.tokens))
    assert (state.commit(3, [4, 5]), list(state.tokens)) == first


def test_commit_past_confirmed_length_is_out_of_range():
    state = SequenceState()
    state.commit(0, [1, 2])
    with pytest.raises(OutOfRange):
        state.commit(5, [3])


def test_always_leaves_a_token_to_feed():
    state = SequenceState()
    state.commit(0, [1, 2])
    state.extend([], cached=2)
    assert state.commit(2, []) == 1 and state.pending() == [2]


@pytest.fixture(scope="module")
def engines():
    with DraftEngine(load_model(DRAFT, "cpu")) as draft, TargetEngine(load_model(TARGET, "cpu")) as target:
        yield draft, target


def fresh_last_logits(spec, tokens):
    """The reference: Hugging Face's own forward over the whole sequence, no cache."""
    with torch.inference_mode():
        return build_tiny_model(spec).eval()(input_ids=torch.tensor([tokens])).logits[0, -1].float()


def assert_cache_matches_fresh_forward(engine, spec, session_id, start, tokens, committed):
    """Sync `engine` to `committed` as a round would; its next logits must equal a fresh forward pass."""
    cached_logits = engine.score(session_id, start, tokens, [])[-1]
    assert engine.cached(session_id) == len(committed)
    torch.testing.assert_close(cached_logits, fresh_last_logits(spec, committed), rtol=1e-4, atol=1e-4)


def test_rollback_logits_equal_fresh_forward(engines):
    draft, target = engines
    for e in engines:
        e.open("s", SamplingParams())
    committed = list(range(10, 30))
    start = 0
    rejected_rounds = 0
    for _ in range(12):
        proposal = draft.propose("s", start, committed[start:], 4)
        verdict = target.verify("s", start, committed[start:], proposal.tokens, None).verdict
        previous, committed = len(committed), committed + verdict.tokens
        if verdict.num_accepted < 4:  # a rejected round: both caches hold tokens that must be rolled back
            rejected_rounds += 1
            for engine, spec in zip(engines, (DRAFT, TARGET)):
                assert_cache_matches_fresh_forward(engine, spec, "s", previous, committed[previous:], committed)
        start = previous
    assert rejected_rounds >= 2, "the tiny pair should disagree now and then"
    for e in engines:
        e.release("s")


def test_engine_errors(engines):
    draft, target = engines
    with pytest.raises(NotFound):
        draft.propose("nobody", 0, [1], 1)
    draft.open("e", SamplingParams())
    with pytest.raises(InvalidArgument):
        draft.propose("e", 0, [1], draft.gamma_max + 1)  # 0 feeds, proposing nothing
    with pytest.raises(InvalidArgument):
        draft.propose("e", 0, [10_000], 1)
    with pytest.raises(OutOfRange):
        draft.propose("e", 3, [1], 1)
    with pytest.raises(OutOfRange):
        draft.propose("e", 0, [1] * 600, 1)
    draft.release("e")
    with TargetEngine(target.loaded, max_sessions=1) as capped:
        capped.open("a", SamplingParams())
        with pytest.raises(ResourceExhausted):
            capped.open("b", SamplingParams())


def test_draft_early_stop_proposes_fewer_tokens_and_keeps_cache_consistent(engines):
    draft, _ = engines
    for mode in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        draft.open("stop", mode)
        full = draft.propose("stop", 0, list(range(10, 20)), 5, min_confidence=0.0)
        assert len(full.tokens) == 5
        short = draft.propose("stop", 0, list(range(10, 20)), 5, min_confidence=0.999)
        assert len(short.tokens) == 1, "a near-certain threshold stops after the first token"
        assert short.tokens == full.tokens[:1], "stopping early must not change what is proposed"
        if short.probs is not None:
            assert short.probs.shape[0] == 1
            torch.testing.assert_close(short.probs[0], full.probs[0])
        assert draft.cached("stop") == 10, "the last proposed token is not fed until it is accepted"
        draft.release("stop")
