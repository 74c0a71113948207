"""End to end through gRPC: greedy identity, seeded sampling, health, reflection, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from conftest import TINY_DRAFT, TINY_TARGET, tiny_options
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack

PROMPTS = [dict(prompt="def fibonacci(n):"), dict(prompt="The quick brown fox"),
           dict(prompt_token_ids=[5, 17, 200, 33, 41, 99, 12])]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["code", "prose", "ids"])
def test_greedy_speculative_equals_target_only(stack, prompt):
    baseline = generate(stack.endpoint, make_request(**prompt, max_new_tokens=48, gamma=0))
    assert len(baseline.token_ids) == 48 and baseline.stats["draft_tokens"] == 0
    for gamma in (1, 3, 5, None):
        result = generate(stack.endpoint, make_request(**prompt, max_new_tokens=48, gamma=gamma))
        assert result.token_ids == baseline.token_ids, f"γ={gamma} diverged from target-only"
        assert result.text == baseline.text
        stats = result.stats
        assert stats["finish_reason"] == "length"
        if gamma is not None:  # the adaptive policy may rightly decide that drafting does not pay here
            assert 0 < stats["accepted_tokens"] < stats["draft_tokens"], "want both accepted and rejected drafts"
            assert stats["rounds"] < 48


def test_an_embedded_orchestrator_has_its_tokenizer_loaded_while_the_services_start(monkeypatch):
    """The embedded stack's orchestrator starts with the tokenizer loaded beside the services' start
    (`preload_tokenizer`), not after they are ready (about a second of the packaged pair's start), and decodes with
    it."""
    import orchestrator.server

    monkeypatch.setattr(orchestrator.server, "load_tokenizer",
                        lambda spec: pytest.fail(f"the orchestrator loaded {spec}'s tokenizer after its services"))
    with EmbeddedStack(tiny_options()) as stack:
        result = generate(stack.endpoint, make_request(prompt="hi", max_new_tokens=4, gamma=0))
    assert len(result.token_ids) == 4 and result.text


def test_a_confident_draft_drafts_past_the_chosen_gamma():
    """Under adaptive γ the draft model drafts on past the controller's γ while its running confidence pays for
    the next token (`GammaController.draft_limit`). This draft is sure of every token (its logits scaled, the
    same argmax), and the target is a larger model, so that drafting pays at the prior α: a round drafts past
    its γ, and the output is still target-only's."""
    confident_draft, larger_target = "tiny:seed=0,logit_scale=50", "tiny:seed=1,hidden=128,layers=3"
    with EmbeddedStack(tiny_options(confident_draft, larger_target)) as running:
        baseline = generate(running.endpoint, make_request(prompt="def fibonacci(n):", max_new_tokens=48, gamma=0))
        adaptive = generate(running.endpoint, make_request(prompt="def fibonacci(n):", max_new_tokens=48))
    assert adaptive.token_ids == baseline.token_ids
    drafted = [(r.gamma, r.drafted) for r in adaptive.rounds if r.proposer == "model"]
    assert drafted, "the draft model never drafted"
    assert any(n > gamma for gamma, n in drafted), f"no round drafted past its γ: {drafted}"


def test_seeded_sampling_reproduces(stack):
    def run(seed, gamma=3):  # the draft model's proposals: lookups depend on the server's memory
        return generate(stack.endpoint, make_request(prompt="hello", max_new_tokens=32, temperature=1.0,
                                                     top_k=50, seed=seed, gamma=gamma, proposer="model")).token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert run(1, gamma=0) == run(1, gamma=0)


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                    dict(temperature=1.0, top_k=20)])
def test_sampled_generation_completes_with_stats(stack, params):
    result = generate(stack.endpoint, make_request(prompt="x = ", max_new_tokens=24, gamma=4, seed=3, **params))
    assert len(result.token_ids) == 24
    assert result.stats["draft_tokens"] > 0 and len(result.stats["gamma_per_round"]) == result.stats["rounds"]


def test_stop_string_ends_generation(stack):
    full = generate(stack.endpoint, make_request(prompt="abc", max_new_tokens=40, gamma=2))
    stop = full.text[10:12]
    assert stop, "the tiny model should produce some text"
    cut = generate(stack.endpoint, make_request(prompt="abc", max_new_tokens=40, gamma=2, stop=[stop]))
    assert cut.stats["finish_reason"] == "stop"
    assert cut.text == full.text[:full.text.find(stop)]


def test_health_and_reflection_on_every_server(stack):
    for address, service in [(stack.endpoint, "specdec.v1.SpecDec"), (stack.draft_address, "specdec.v1.DraftService"),
                             (stack.target_address, "specdec.v1.TargetService")]:
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.SERVING
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            reply = next(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            names = {s.name for s in reply.list_services_response.service}
            assert service in names and "grpc.health.v1.Health" in names


def test_cli_generate_json_matches_server(stack):
    """`specdec generate --json` (its own one-shot stack) prints what a server sends for the same greedy
    request: the same tokens, text and log-probabilities as the `stack` fixture's server, and stats that
    agree with its own per-round records."""
    prompt, new_tokens = "def fibonacci(n):", 16
    cmd = [sys.executable, "-m", "specdec.cli.main", "generate", "--prompt", prompt,
           "--max-new-tokens", str(new_tokens), "--gamma", "3", "--draft-model", TINY_DRAFT, "--target-model",
           TINY_TARGET, "--device", "cpu", "--json", "--logprobs", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(payload) == {"text", "token_ids", "stats", "rounds", "logprobs"}
    served = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=new_tokens, gamma=3,
                                                   top_logprobs=2)).to_json()
    assert (payload["token_ids"], payload["text"]) == (served["token_ids"], served["text"])
    assert len(payload["token_ids"]) == new_tokens
    assert [lp["token_id"] for lp in payload["logprobs"]] == payload["token_ids"]
    for mine, theirs in zip(payload["logprobs"], served["logprobs"], strict=True):
        assert mine["logprob"] == pytest.approx(theirs["logprob"], abs=1e-5)
        assert [t for t, _ in mine["top"]] == [t for t, _ in theirs["top"]]
        assert mine["logprob"] == mine["top"][0][1]  # greedy: the token is the likeliest
    stats, rounds = payload["stats"], payload["rounds"]
    drafted = sum(int(r["drafted"]) for r in rounds)
    accepted = sum(int(r["accepted"]) for r in rounds)
    assert stats["finish_reason"] == "length" and stats["generated_tokens"] == new_tokens
    assert stats["prompt_tokens"] == served["stats"]["prompt_tokens"] > 0
    assert stats["rounds"] == len(rounds) and sum(int(r["emitted"]) for r in rounds) == new_tokens
    assert stats["gamma_per_round"] == [r["gamma"] for r in rounds]
    assert (stats["draft_tokens"], stats["accepted_tokens"]) == (drafted, accepted)
    assert stats["acceptance_rate"] == pytest.approx(accepted / drafted if drafted else 0.0)
    assert stats["tokens_per_second"] == pytest.approx(new_tokens / stats["total_s"], rel=1e-6)

