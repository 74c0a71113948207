"""The static runner (`specdec.engine.static`) on CPU: the same logic CUDA runs with graphs. Its KV pool
and slots, rollback by length, buckets and padding, prefill pieces, agreement with the ragged runner,
and greedy identity through the services. CUDA-only checks are in test_cuda.py."""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import assert_pieces_keep_their_rows, assert_speculated, tiny_options

from specdec.cli.client import generate, make_request
from specdec.core.errors import ResourceExhausted
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.launch.stack import EmbeddedStack

SPEC = "tiny:seed=0"
PROMPT = list(range(40, 75))


@pytest.fixture(scope="module")
def static():
    return load_model(SPEC, "cpu", runner="static", slots=6).runner


@pytest.fixture(scope="module")
def ragged():
    return load_model(SPEC, "cpu", runner="ragged").runner


def _decode(runner, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    cache = runner.new_cache()
    logits = runner.forward([Step(cache, prompt)])[0]
    tokens, rows = [], [logits]
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits = runner.forward([Step(cache, tokens[-1:])])[0]
        rows.append(logits)
    return tokens, rows


def test_it_computes_what_the_ragged_runner_computes(static, ragged):
    """The same model and kernels; only the attention differs (fused over the pool vs blocked): the
    greedy tokens agree and the logits within float32 rounding."""
    mine, my_rows = _decode(static, PROMPT, 20)
    theirs, their_rows = _decode(ragged, PROMPT, 20)
    assert mine == theirs
    for a, b in zip(my_rows, their_rows, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_long_prompt_goes_in_segments_over_several_pieces(static, ragged):
    """8 segments of `rows` tokens fill a piece: 10 segments and a part need two pieces, and the logits
    asked for span several segments."""
    prompt = [(7 * i) % 250 for i in range(10 * static.rows + 5)]
    asked = 3 * static.rows + 2
    mine = static.forward([Step(static.new_cache(), prompt, logits=asked)])[0]
    theirs = ragged.forward([Step(ragged.new_cache(), prompt, logits=asked)])[0]
    assert mine.shape == theirs.shape == (asked, static.vocab)
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_a_prompts_chunking_does_not_change_its_bits(static):
    """Alone in one step, or fed in chunks of 4 and 13 beside another session's steps (as the batcher
    feeds a prompt while others decode): the prompt's last logits are the same bits."""
    prompt = [(5 * i) % 250 for i in range(40)]
    whole = static.forward([Step(static.new_cache(), prompt)])[0]
    cache, other = static.new_cache(), static.new_cache()
    static.forward([Step(other, PROMPT)])
    for begin, end in ((0, 4), (4, 17), (17, 30), (30, 40)):
        last = static.forward([Step(other, [9]), Step(cache, prompt[begin:end])])[1]
    assert torch.equal(last, whole)


def test_a_tokens_logits_do_not_depend_on_gamma_or_the_other_sessions(static):
    """Bit for bit: one token alone, the same token at the head of a γ+1 block, the same step among
    1, 3 or 5 other sessions (buckets of 2, 4 and 8), and beside a session far into its context (a longer
    key window) give the same logits."""
    _assert_row_invariant(static)


def test_compiled_a_tokens_logits_do_not_depend_on_gamma_or_the_other_sessions():
    """The piece through torch.compile (Inductor's CPU code here, Triton's on CUDA: tests/test_cuda.py), bf16
    as on a GPU: every bucket runs the same generated kernels, and a row's logits keep their bits."""
    from specdec.engine.models import load_hf_model
    from specdec.engine.static.runner import StaticRunner

    torch._dynamo.reset()
    model = load_hf_model(SPEC, torch.device("cpu"), torch.bfloat16)
    runner = StaticRunner(model, "bf16", slots=13, context=512, rows=9, graphs=False, compile=True)
    assert runner.compiled and 1 not in runner.session_buckets
    _assert_row_invariant(runner)
    torch._dynamo.reset()


def _assert_row_invariant(static) -> None:
    def fresh():
        cache = static.new_cache()
        static.forward([Step(cache, PROMPT)])
        return cache

    def others(count: int) -> list[Step]:
        return [Step(fresh(), [3 + i, 9, 27][: 1 + i % 3], logits=1) for i in range(count)]

    alone = static.forward([Step(fresh(), [11], logits=1)])[0]
    block = static.forward([Step(fresh(), [11, 12, 13, 14, 15], logits=5)])[0]
    assert torch.equal(block[:1], alone)
    for count in (1, 3, 5):
        crowd = others(count)
        shared = static.forward([*crowd[: count // 2], Step(fresh(), [11], logits=1), *crowd[count // 2:]])
        assert torch.equal(shared[count // 2], alone), f"changed beside {count} other sessions"
        del crowd, shared
        gc.collect()
    far = static.new_cache()  # a neighbour whose position puts the piece in a longer key window
    static.forward([Step(far, [1 + i % 200 for i in range(300)])])
    shared = static.forward([Step(far, [7], logits=1), Step(fresh(), [11], logits=1)])
    assert static.windows[0] < 310 <= static.windows[1]
    assert torch.equal(shared[1], alone), "changed beside a session in a longer key window"


def test_a_row_keeps_its_bits_beside_a_far_neighbour_at_every_position(static):
    """Beside a session at position 300 (the 512 window on a GPU) a row at any position gives its bits alone.
    CPU attention's bits depend on the window's length (about half of these positions changed), so on CPU
    every piece attends over the longest window."""
    tokens = [(7 * i + 3) % 200 + 1 for i in range(300)]
    for position in range(20, 256, 23):
        cache = static.new_cache()
        static.forward([Step(cache, tokens[:position])])
        alone = static.forward([Step(cache, [tokens[position]], logits=1)])[0]
        cache.length = position
        far = static.new_cache()
        static.forward([Step(far, tokens)])
        shared = static.forward([Step(far, [7], logits=1), Step(cache, [tokens[position]], logits=1)])[1]
        assert torch.equal(shared, alone), f"at position {position}"
        del cache, far
        gc.collect()


def test_rollback_is_setting_the_length(static):
    cache = static.new_cache()
    static.forward([Step(cache, PROMPT)])
    first = static.forward([Step(cache, [5, 6, 7], logits=3)])[0]
    assert cache.crop(len(PROMPT) + 1) == 2 and cache.length == len(PROMPT) + 1
    again = static.forward([Step(cache, [6, 7], logits=2)])[0]
    assert torch.equal(again, first[1:]), "a rolled-back cache must give the same bits as before"
    rejected = static.forward([Step(cache, [99], logits=1)])[0]
    assert not torch.equal(rejected, first[2:])


def test_slots_are_taken_and_given_back():
    runner = load_model(SPEC, "cpu", runner="static", slots=2).runner
    a, b = runner.new_cache(), runner.new_cache()
    assert {a.slot, b.slot} == {0, 1} and runner.pool.free_slots == 0
    with pytest.raises(ResourceExhausted, match="2 slots"):
        runner.new_cache()
    del a
    gc.collect()
    c = runner.new_cache()
    assert c.slot != b.slot and runner.pool.free_slots == 0
    with pytest.raises(ValueError, match="context"):
        c.reserve(runner.max_context + 1)


def test_an_ended_sessions_slot_is_free_for_the_next_at_once():
    """Through the engine and its batcher, whose idle worker used to keep its last pass's steps (and so their
    sessions' slots) until the next pass: a full pool refused the next session."""
    from specdec.core.params import SamplingParams
    from specdec.engine.target_engine import TargetEngine

    engine = TargetEngine(load_model(SPEC, "cpu", runner="static", slots=1), max_sessions=1, prefix_cache_bytes=0)
    try:
        for name in ("first", "next"):
            engine.open(name, SamplingParams())
            engine.verify(name, 0, PROMPT, [], None)
            engine.release(name)
    finally:
        engine.close()


def test_the_context_is_the_pools():
    loaded = load_model(SPEC, "cpu", runner="static", slots=1, context=100)
    assert loaded.max_context == loaded.runner.max_context == 100
    assert loaded.runner.windows == [256]  # 100 + rows, a whole number of the smallest window
    assert loaded.runner.pool.keys[0].shape[1] == 257  # and one position never attended


def test_layers_run_eagerly_by_default_off_cuda(monkeypatch):
    """Compiled layers are CUDA's default (tests/test_cuda.py); on CPU the layers run eagerly unless
    SPECDEC_STATIC_COMPILE=1 asks."""
    monkeypatch.delenv("SPECDEC_STATIC_COMPILE", raising=False)
    assert not load_model(SPEC, "cpu", dtype="bf16", runner="static", slots=2).runner.compiled


def test_greedy_speculation_equals_target_only_through_the_services():
    opts = tiny_options(service=dict(runner="static"))
    with EmbeddedStack(opts) as running:
        for prompt in ("def fibonacci(n):", "The quick brown fox"):
            baseline = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=40, gamma=0))
            for gamma in (1, 3, 6):
                result = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=40, gamma=gamma))
                assert result.token_ids == baseline.token_ids, f"γ={gamma} diverged on {prompt!r}"
                assert_speculated(result, f"at γ={gamma}")


def test_compiled_one_layers_code_serves_every_layer_and_bucket_and_writes_the_pool_in_place(monkeypatch):
    """torch.compile makes in-place writes functional. Into a view of one [layers, ...] pool tensor that
    became a scatter of the whole pool and a copy of it back, every step (measured on an H100: the compiled
    step 2.5x slower than eager). Into a tensor of its own per layer, it is one `index_put` that Inductor
    writes in place. And one compilation serves every layer and every bucket (the whole piece compiled took
    100-190 s to start on the H100, recompiling per bucket). Checked on the graphs torch.compile hands its
    compiler, and on what the compiled layers compute."""
    from torch._dynamo.backends.common import aot_autograd

    monkeypatch.setenv("SPECDEC_STATIC_COMPILE", "1")
    runner = load_model(SPEC, "cpu", dtype="bf16", runner="static", slots=3).runner
    monkeypatch.delenv("SPECDEC_STATIC_COMPILE")
    graphs = []

    def keep(graph, _inputs):
        graphs.append(graph)
        return graph

    torch._dynamo.reset()
    assert runner.compiled
    runner.layer_step = torch.compile(runner._layer_step, backend=aot_autograd(fw_compiler=keep))  # to see its graph
    with torch.inference_mode():  # inputs made as a pass makes them (inference tensors)
        R = runner.rows
        packed = torch.tensor([[5, 9, *[0] * (R - 2), *range(R), 1], [*[0] * R, *range(R), runner.pool.scratch]])
        compiled = runner._piece(packed, torch.arange(runner.windows[0]))
        for bucket, _, window in runner.shapes():  # every shape a CUDA graph is captured for, on scratch rows
            runner._piece(runner._inputs([], bucket), runner._key_positions[window])
    assert len(runner.shapes()) == 3 * 3
    assert len(graphs) == 1, f"{len(graphs)} compilations for {len(runner.layers)} layers and {runner.shapes()}"
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    scatters = [t for t in targets if "scatter" in str(t)]
    assert not scatters, f"the pool is written by scattering into a whole tensor: {scatters}"
    assert sum("index_put" in str(t) for t in targets) == 2, "a layer writes its keys and its values"
    written = [pool[1, :2] for pool in runner.pool.keys]
    assert all(bool(rows.abs().sum(-1).gt(0).all()) for rows in written), "the compiled layers must fill the slot"
    fresh = load_model(SPEC, "cpu", dtype="bf16", runner="static", slots=3).runner
    with torch.inference_mode():
        eager = fresh._piece(packed, torch.arange(fresh.windows[0]))
    for mine, theirs in zip(runner.pool.keys, fresh.pool.keys, strict=True):
        torch.testing.assert_close(mine[1, :2], theirs[1, :2], rtol=0.02, atol=0.07)  # bf16, fused in float32
    assert compiled[0, :2].argmax(-1).tolist() == eager[0, :2].argmax(-1).tolist()
    torch._dynamo.reset()


class _EagerBank:
    """Stands in for `GraphBank` on CPU, where no CUDA graph can be captured: `capture` runs the piece once,
    as a capture's warm-up does (and with it, the compiler)."""

    def __init__(self, forward, device):
        self.forward, self.shapes = forward, set()

    def capture(self, *inputs: torch.Tensor) -> None:
        self.forward(*inputs)
        self.shapes.add(tuple(tuple(t.shape) for t in inputs))

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.forward(*inputs)

    def __len__(self) -> int:
        return len(self.shapes)


class _ReplayBank(_EagerBank):
    """As a CUDA graph's: the output of a shape is one tensor, which the next run of that shape overwrites."""

    def __init__(self, forward, device):
        super().__init__(forward, device)
        self.outputs: dict[tuple, torch.Tensor] = {}

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        computed = self.forward(*inputs)
        output = self.outputs.setdefault(tuple(tuple(t.shape) for t in inputs), torch.empty_like(computed))
        return output.copy_(computed)


def test_two_pieces_of_one_graph_in_a_pass_keep_their_own_logits(monkeypatch):
    """On CUDA a pass of more than 8 segments replays a graph for each piece of 8, the same graph for pieces of
    one shape. Here a stand-in keeps a graph's semantics: one output a shape, overwritten by the next run."""
    import specdec.engine.static.runner as static_runner
    from specdec.engine.models import load_hf_model

    monkeypatch.setattr(static_runner, "GraphBank", _ReplayBank)
    runner = static_runner.StaticRunner(load_hf_model(SPEC, torch.device("cpu"), torch.float32), "fp32", slots=9,
                                        graphs=True)
    assert isinstance(runner.graphs, _ReplayBank)
    assert_pieces_keep_their_rows(runner)


def test_compiled_layers_that_fail_at_start_up_fall_back_to_eager_ones(monkeypatch):
    """A compiler failure at start-up (in a capture's warm-up) leaves the service running, its layers eager,
    every shape captured, and each token's logits those of a runner that never compiled."""
    import specdec.engine.static.runner as static_runner
    from specdec.engine.models import load_hf_model

    monkeypatch.setattr(static_runner, "GraphBank", _EagerBank)
    model = load_model(SPEC, "cpu", dtype="bf16", runner="static", slots=3).runner  # eager, for comparison
    monkeypatch.setenv("SPECDEC_STATIC_COMPILE", "1")
    runner = static_runner.StaticRunner(load_hf_model(SPEC, torch.device("cpu"), torch.bfloat16), "bf16", slots=3,
                                        graphs=True)
    assert runner.compiled and 1 not in runner.session_buckets

    def broken(*args, **kwargs):
        raise RuntimeError("the compiler failed")

    runner.layer_step = broken
    runner.capture()
    assert not runner.compiled and runner.session_buckets[0] == 1
    assert len(runner.graphs) == len(runner.shapes())
    mine, theirs = runner.new_cache(), model.new_cache()
    assert torch.equal(runner.forward([Step(mine, PROMPT)])[0], model.forward([Step(theirs, PROMPT)])[0])
