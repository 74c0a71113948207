"""The GPU path on CUDA (marker `cuda`; skipped without a GPU): the static runner's graphs, its batch
invariance bit for bit (its piece eager and compiled, its attention either kernel), and greedy speculative
output identical to target-only through the services, for every γ, adaptive γ and 8 or 16 concurrent users,
on a synthetic pair."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import assert_pieces_keep_their_rows, assert_speculated, tiny_options

from specdec.cli.client import generate, make_request
from specdec.core.params import SamplingParams
from specdec.engine.batcher import StepBatcher
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.launch.stack import EmbeddedStack
from specdec.tools.bench.speed import service_infos

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DRAFT, TARGET = "synthetic:draft,shape=small,eps=0.1", "synthetic:target,shape=small,eps=0.1"
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "x = [1, 2, 3]\nfor"]


@pytest.fixture(scope="module", params=[(False, "pool"), (True, "pool"), (True, "sdpa")],
                ids=["eager", "compiled", "compiled-sdpa"])
def runner(request):
    """The static runner with its graphs, the piece eager or through torch.compile (SPECDEC_STATIC_COMPILE), its
    attention the Triton kernel over the pool (the default on CUDA) or scaled_dot_product_attention."""
    compiled, attention = request.param
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECDEC_STATIC_COMPILE", "1" if compiled else "0")
        env.setenv("SPECDEC_STATIC_ATTENTION", attention)
        built = load_model(TARGET, "cuda", runner="static", slots=16).runner
    assert (built.compiled, built.attention) == (compiled, attention)
    return built


def test_every_shape_is_a_captured_graph(runner):
    assert runner.graphs is not None and len(runner.graphs) == len(runner.shapes())


def test_a_lone_step_runs_on_its_callers_thread_with_the_runners_bits(runner):
    batcher = StepBatcher(runner)
    try:
        assert batcher.inline, "on CUDA a lone session's step skips the worker"
        prompt = list(range(40, 60))
        direct = runner.forward([Step(runner.new_cache(), prompt, logits=1)])[0]
        assert torch.equal(batcher.forward(Step(runner.new_cache(), prompt, logits=1)), direct)
        assert batcher.forwards == 1
    finally:
        batcher.close()


def test_the_batcher_times_a_pass_on_the_device_not_its_launch(runner):
    """A pass returns once queued; the return wait is capped by the device's time for it (CUDA events)."""
    batcher = StepBatcher(runner)
    try:
        assert batcher.pass_times is not None
        batcher.forward(Step(runner.new_cache(), list(range(40, 60)), logits=1))
        torch.cuda.synchronize()
        device_s = batcher.pass_times.latest_s()
        assert device_s is not None and 0 < device_s < 1.0, device_s
        assert batcher._pass_seconds(0.0) == device_s
    finally:
        batcher.close()


def test_logits_do_not_depend_on_gamma_bucket_or_neighbours(runner):
    prompt = list(range(40, 75))

    def fresh():
        cache = runner.new_cache()
        runner.forward([Step(cache, prompt)])
        return cache

    alone = runner.forward([Step(fresh(), [11], logits=1)])[0]
    for gamma in range(1, runner.rows):
        block = runner.forward([Step(fresh(), [11, *range(12, 12 + gamma)], logits=gamma + 1)])[0]
        assert torch.equal(block[:1], alone), f"the first row changed in a verify of γ={gamma}"
    for others in (1, 3, 7):
        steps = [*(Step(fresh(), [3 + i, 9][: 1 + i % 2], logits=1) for i in range(others)),
                 Step(fresh(), [11], logits=1)]
        assert torch.equal(runner.forward(steps)[-1], alone), f"changed beside {others} other sessions"
    far = runner.new_cache()  # a neighbour whose position puts the piece in a longer key window, then the longest
    runner.forward([Step(far, [1 + i % 200 for i in range(300)])])
    for grown in (0, runner.windows[-2] - 310):
        if grown:
            runner.forward([Step(far, [1 + i % 200 for i in range(grown)])])
        shared = runner.forward([Step(far, [7], logits=1), Step(fresh(), [11], logits=1)])
        assert torch.equal(shared[1], alone), f"changed beside a session at position {far.length - 1}"


def test_two_pieces_of_one_graph_in_a_pass_keep_their_own_logits(runner):
    assert_pieces_keep_their_rows(runner)


def test_a_next_turn_on_a_kept_cache_scores_the_bits_of_a_cold_start(monkeypatch):
    """Kept caches on the GPU's runner: turn 2 takes turn 1's pool slot, feeds only its new tokens, and its
    logits equal an engine's that keeps nothing (one runner under both; its piece eager, which captures in
    seconds: taking a slot is the same for either)."""
    monkeypatch.setenv("SPECDEC_STATIC_COMPILE", "0")
    loaded = load_model(TARGET, "cuda", runner="static", slots=8)
    warm, cold = TargetEngine(loaded), TargetEngine(loaded, prefix_cache_bytes=0)
    try:
        prompt, logits, kept = list(range(40, 80)), [], []
        for engine in (warm, cold):
            engine.open("turn-1", SamplingParams())
            emitted = engine.verify("turn-1", 0, prompt, [5, 6, 7], None).verdict.tokens
            engine.release("turn-1")
            kept.append(len(engine.prefix_cache))
            engine.open("turn-2", SamplingParams())
            logits.append(engine.score("turn-2", 0, prompt + emitted + [11, 12], [1, 2]))
            kept.append(len(engine.prefix_cache))
        assert kept == [1, 0, 0, 0], "warm kept turn 1 and turn 2 took it; cold kept nothing"
        assert torch.equal(*logits)
    finally:
        warm.close(), cold.close()


@pytest.fixture(scope="module")
def cuda_stack():
    opts = tiny_options(DRAFT, TARGET, service=dict(device="cuda"), orchestrator=dict(gamma_max=8))
    with EmbeddedStack(opts) as running:
        yield running


@pytest.mark.skipif("SPECDEC_STATIC_COMPILE" in os.environ, reason="SPECDEC_STATIC_COMPILE chooses instead")
def test_the_services_compile_their_layers_by_default_on_cuda(cuda_stack):
    draft, target = service_infos(cuda_stack)
    assert draft.kernel.endswith("-compiled-graphs") and target.kernel.endswith("-compiled-graphs"), \
        (draft.kernel, target.kernel)


def test_greedy_speculation_equals_target_only_on_cuda(cuda_stack):
    for prompt in PROMPTS:
        baseline = generate(cuda_stack.endpoint, make_request(prompt=prompt, max_new_tokens=96, gamma=0)).token_ids
        for gamma in (*range(1, 9), None):
            result = generate(cuda_stack.endpoint, make_request(prompt=prompt, max_new_tokens=96, gamma=gamma))
            assert result.token_ids == baseline, f"γ={gamma} diverged from target-only on {prompt!r}"
            if gamma is not None:
                assert_speculated(result, f"at γ={gamma} on {prompt!r}")


def test_a_seeded_sample_equals_target_only_on_cuda(cuda_stack):
    """The coupled sampler (the default) on the static runner: a seed's sampled output is target-only's under any γ."""
    for prompt in PROMPTS:
        sampled = dict(prompt=prompt, max_new_tokens=64, temperature=0.9, top_p=0.95, seed=5, sampler="coupled")
        baseline = generate(cuda_stack.endpoint, make_request(gamma=0, **sampled)).token_ids
        for gamma in (1, 4, 8, None):
            result = generate(cuda_stack.endpoint, make_request(gamma=gamma, **sampled))
            assert result.token_ids == baseline, f"γ={gamma} diverged from target-only on {prompt!r}"


@pytest.mark.parametrize("users", [8, 16])
def test_concurrent_users_equal_target_only_on_cuda(cuda_stack, users):
    """16 users: passes of more than 8 segments, two pieces that may replay one graph (each piece's rows must be
    copied out before the next replays it)."""
    baseline = {p: generate(cuda_stack.endpoint, make_request(prompt=p, max_new_tokens=64, gamma=0)).token_ids
                for p in PROMPTS}
    work = [(PROMPTS[i % len(PROMPTS)], (None, 0, 3, 6)[i % 4]) for i in range(users)]
    with ThreadPoolExecutor(users) as pool:
        results = list(pool.map(lambda w: generate(cuda_stack.endpoint, make_request(prompt=w[0], max_new_tokens=64,
                                                                                      gamma=w[1])), work))
    for (prompt, gamma), result in zip(work, results, strict=True):
        assert result.token_ids == baseline[prompt], f"γ={gamma} among {users} users diverged on {prompt!r}"
