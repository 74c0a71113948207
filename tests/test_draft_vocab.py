"""A draft whose output layer scores only part of the vocabulary (`--draft-vocab`): the rule, the runner's
logits, and losslessness through the services when the target's likely tokens are ones the draft can
never propose."""

from __future__ import annotations

import subprocess

import torch
from conftest import GGUF_DRAFT, GGUF_TARGET, tiny_options
from test_lossless_e2e import SAMPLES, assert_follows, first_tokens
from test_profile_cache import generate_cli

from orchestrator.clients import draft_client, target_client
from specdec.cli.client import generate, make_request
from specdec.core.params import SamplingParams
from specdec.core.sampling import probs_from_logits
from specdec.engine.models import DRAFT_VOCAB_AUTO, draft_vocabulary, load_model
from specdec.engine.runner import UNSCORED, Step
from specdec.launch.stack import EmbeddedStack


def test_the_rule_keeps_the_low_ids_and_the_end_of_sequence_ids():
    assert draft_vocabulary(151936, (151645, 151643)) == [(0, DRAFT_VOCAB_AUTO), (151643, 151644), (151645, 151646)]
    assert draft_vocabulary(151936, (151643, 151644, 7), 1000) == [(0, 1000), (151643, 151645)]
    assert draft_vocabulary(100000, (5,)) == [], "a vocabulary of at most twice the limit is scored whole"
    assert draft_vocabulary(151936, (151643,), 0) == [] and draft_vocabulary(300, (), 300) == []


def test_the_runner_scores_the_kept_ids_exactly_and_no_others():
    """On gguf-q8 the cut output layer gives the kept ids the full layer's bits and every other id
    UNSCORED; the exact gguf path's output layer is not cut."""
    runner = load_model(GGUF_DRAFT, "cpu").runner
    tokens = [5, 17, 101, 3, 250, 42]
    full = runner.forward([Step(runner.new_cache(), tokens, logits=6)])[0]
    ranges = [(0, 120), (200, 201), (258, 260)]
    assert runner.limit_vocabulary(ranges) and runner.scored_tokens() == 123
    cut = runner.forward([Step(runner.new_cache(), tokens, logits=6)])[0]
    kept = torch.zeros(260, dtype=torch.bool)
    for begin, end in ranges:
        kept[begin:end] = True
    assert torch.equal(cut[:, kept], full[:, kept])
    assert (cut[:, ~kept] == UNSCORED).all()
    assert runner.linear_kernels()[-1].out_features == 123, "the pass reads the cut layer"
    exact = load_model(GGUF_DRAFT, "cpu", dtype="gguf").runner
    assert not exact.limit_vocabulary(ranges) and exact.scored_tokens() is None


def test_lossless_when_the_draft_cannot_propose_the_targets_likely_tokens():
    """The draft scores ids below a limit that splits the target's 8 likeliest first tokens: those above
    it are never proposed, yet every first token still follows the target's law (they come from the
    residual), and greedy speculative output equals target-only."""
    prompt = [40, 41, 42, 43]
    params = SamplingParams(temperature=1.0, top_k=8)
    target = load_model(GGUF_TARGET, "cpu").runner
    p = probs_from_logits(target.forward([Step(target.new_cache(), prompt)])[0], params)[0]  # [V]
    top = sorted(p.topk(8).indices.tolist())
    limit = top[4]  # top[:4] can be proposed, top[4:] cannot
    options = tiny_options(GGUF_DRAFT, GGUF_TARGET, service={"draft_vocab": limit})
    with EmbeddedStack(options) as stack:
        assert [client.info().scored_tokens for client in (draft_client(stack.draft_address),
                                                            target_client(stack.target_address))] == [limit, 260]
        drawn = first_tokens(stack.endpoint, prompt, range(SAMPLES), 8, temperature=1.0, top_k=8)
        assert_follows(drawn, p)
        unproposable = sum(1 for token, _ in drawn if token >= limit)
        assert unproposable > 0.05 * SAMPLES, "the test needs the residual to emit tokens the draft cannot propose"
        assert 0 < sum(r.accepted for _, r in drawn) < SAMPLES
        assert_greedy_speculation_is_target_only(stack.endpoint)


def assert_greedy_speculation_is_target_only(endpoint: str) -> None:
    """Greedy output at γ = 3 and adaptive equals target-only's, on a code and a prose prompt."""
    for text in ("def fibonacci(n):", "The quick brown fox"):
        baseline = generate(endpoint, make_request(prompt=text, max_new_tokens=30, gamma=0)).token_ids
        for gamma in (3, None):
            assert generate(endpoint, make_request(prompt=text, max_new_tokens=30, gamma=gamma)).token_ids \
                == baseline, f"γ={gamma} diverged from target-only on {text!r}"


def test_generate_names_the_cut_and_profiles_it_apart(tmp_path):
    """`specdec generate --draft-vocab N` says on stderr that the draft's output layer scores N ids (the
    target's line says nothing of it), and its cost profile is kept apart from the whole layer's."""

    def generate_with(limit: int) -> subprocess.CompletedProcess:
        run = generate_cli(tmp_path, "--draft-vocab", str(limit), draft=GGUF_DRAFT, target=GGUF_TARGET)
        assert run.returncode == 0, run.stderr[-3000:]
        return run

    lines = {line.split(":")[0]: line for line in generate_with(200).stderr.splitlines()
             if line.startswith(("draft:", "target:"))}
    assert "on path gguf-q8" in lines["draft"] and "output layer 200 of 260 token ids" in lines["draft"]
    assert "output layer" not in lines["target"]
    profiles = set(tmp_path.glob("*.json"))
    assert len(profiles) == 2
    generate_with(0)
    assert len(set(tmp_path.glob("*.json")) - profiles) == 1, "the whole output layer is profiled apart"
