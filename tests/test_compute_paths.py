"""The compute layer: kernels, the KV cache, the runner's forward pass and its row invariance."""

from __future__ import annotations

import copy
import logging
import threading
from types import SimpleNamespace

import pytest
import torch

import specdec.engine.measure as measure_module
from specdec.engine.attention import BLOCK, block_sum
from specdec.engine.compute import build_runner, resolve_path
from specdec.engine.cpu.features import cpu_features
from specdec.engine.kernels import Int8Kernel, make_kernel
from specdec.engine.kvcache import KVCache
from specdec.engine.measure import measure
from specdec.engine.models import build_tiny_model
from specdec.engine.runner import ModelRunner, Step, UnsupportedModel
from specdec.planning.cost import PROFILE_CONTEXT, CostProfile, positions_past

TOKENS = [5, 17, 101, 3, 250, 42, 7, 9, 11, 13, 200, 31, 77, 64, 2, 99]
PATHS = [("fp32", "onednn"), ("bf16", "dense"), ("int8", "dense")]


def runner(path: str = "fp32", kernel: str = "onednn", spec: str = "tiny:seed=0") -> ModelRunner:
    return ModelRunner(build_tiny_model(spec).eval(), path, fp32_kernel=kernel)


def hf_logits(spec: str, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return build_tiny_model(spec).eval()(input_ids=torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("spec", ["tiny:seed=0", "tiny:seed=1,heads=4,kv_heads=1,layers=3"])
@pytest.mark.parametrize("kernel", ["dense", "onednn"])
def test_fp32_runner_matches_hugging_face_through_cache_and_rollback(spec, kernel):
    full = hf_logits(spec, TOKENS)
    model = runner("fp32", kernel, spec)
    cache = model.new_cache()
    steps = [model.forward([Step(cache, TOKENS[:6], logits=6)])[0], model.forward([Step(cache, TOKENS[6:7])])[0],
             model.forward([Step(cache, TOKENS[7:12], logits=5)])[0]]
    torch.testing.assert_close(torch.cat(steps), full[:12], rtol=1e-4, atol=1e-4)
    cache.crop(9)  # roll back three positions, then feed a different continuation's positions again
    again = model.forward([Step(cache, TOKENS[9:16], logits=7)])[0]
    torch.testing.assert_close(again, full[9:16], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path,kernel", PATHS)
def test_lossy_paths_track_fp32(path, kernel):
    full = hf_logits("tiny:seed=0", TOKENS)
    model = runner(path, kernel)
    got = model.forward([Step(model.new_cache(), TOKENS, logits=len(TOKENS))])[0]
    assert (got.argmax(-1) == full.argmax(-1)).float().mean() >= 0.9
    assert torch.nn.functional.cosine_similarity(got, full, dim=-1).min() > 0.99


@pytest.mark.parametrize("path,kernel", [*PATHS, ("gguf", "gguf"), ("gguf-q8", "gguf")])
def test_a_tokens_logits_do_not_depend_on_what_is_computed_with_it(path, kernel):
    """Decoded alone, verified in a block, batched with another session, or prefilled in chunks that
    cross an attention block: the same bits. This is what makes greedy speculative output equal
    target-only output exactly on these paths (gguf, gguf-q8: a model quantized as a Q4_K_M file is)."""
    model = runner(path, kernel, "tiny:seed=0,hidden=256,gguf=1" if path.startswith("gguf") else "tiny:seed=0")
    prefix, tail = TOKENS[:5], TOKENS[5:]

    cache = model.new_cache()
    model.forward([Step(cache, prefix)])
    decoded = torch.cat([model.forward([Step(cache, [t])])[0] for t in tail])

    cache.crop(len(prefix))
    verified = model.forward([Step(cache, tail, logits=len(tail))])[0]

    cache.crop(len(prefix))
    other = model.new_cache()
    model.forward([Step(other, TOKENS[:3])])
    batched = model.forward([Step(other, TOKENS[3:12], logits=2), Step(cache, tail, logits=len(tail))])[1]

    long = [(7 * i) % 250 for i in range(BLOCK + 10)]
    one, chunked = model.new_cache(), model.new_cache()
    whole = model.forward([Step(one, long, logits=4)])[0]
    model.forward([Step(chunked, long[:BLOCK - 3])])
    parts = model.forward([Step(chunked, long[BLOCK - 3:], logits=4)])[0]

    assert torch.equal(decoded, verified)
    assert torch.equal(verified, batched)
    assert torch.equal(whole, parts)


@pytest.mark.parametrize("path,kernel", [*PATHS, ("gguf", "gguf"), ("gguf-q8", "gguf")])
def test_past_four_attention_blocks_a_verify_gives_a_decodes_bits(path, kernel):
    """With five or more key blocks cached, a 6-token verify, one-token decodes and a whole prefill give each
    position the same bits. Torch's sum over the block axis ordered its additions by the number of query rows,
    which broke this past 256 positions on the torch-attention paths (fp32 and gguf): the blocks are now added
    in a fixed tree (`specdec.engine.attention.block_sum`)."""
    model = runner(path, kernel, "tiny:seed=0,hidden=256,gguf=1" if path.startswith("gguf") else "tiny:seed=0")
    tokens = [(7 * i + 3) % 200 + 1 for i in range(7 * BLOCK)]
    for start in (4 * BLOCK + 14, 6 * BLOCK + 30):
        cache = model.new_cache()
        model.forward([Step(cache, tokens[:start])])
        verified = model.forward([Step(cache, tokens[start:start + 6], logits=6)])[0]
        cache.crop(start)
        decoded = torch.cat([model.forward([Step(cache, [t])])[0] for t in tokens[start:start + 6]])
        whole = model.forward([Step(model.new_cache(), tokens[:start + 6], logits=6)])[0]
        assert torch.equal(verified, decoded), f"at position {start}"
        assert torch.equal(whole, decoded), f"at position {start}"


def test_block_sums_are_a_fixed_tree_that_trailing_zero_blocks_do_not_change():
    parts = torch.randn(2, 5, 7, 3, generator=torch.Generator().manual_seed(1))
    tree = ((parts[:, 0] + parts[:, 1]) + (parts[:, 2] + parts[:, 3])) + parts[:, 4]
    assert torch.equal(block_sum(parts), tree)
    padded = torch.cat([parts, torch.zeros(2, 6, 7, 3)], dim=1)  # 11 blocks, the last 6 empty
    assert torch.equal(block_sum(padded), tree)
    assert torch.equal(block_sum(parts[:, :, :2]), tree[:, :2]), "a row's sum does not depend on the others"


@pytest.mark.parametrize("bits", [None, 7, 8])
def test_int8_kernel_is_exact_integer_arithmetic(bits):
    """Each int8 variant computes its definition exactly: 8-bit weights where VNNI is present (and
    not capped away), 7-bit everywhere; None is the variant this machine gets by default."""
    if bits == 8 and not cpu_features().vnni:
        pytest.skip(f"8-bit weights need VNNI; {cpu_features().describe()} has none")
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32), torch.randn(48)
    x = torch.randn(5, 32) * torch.tensor([[0.1], [1.0], [3.0], [10.0], [1.0]]) + torch.tensor([[0.0]] * 4 + [[2.0]])
    kernel = Int8Kernel(weight, bias, weight_bits=bits)
    wmax = 2 ** ((bits or (8 if cpu_features().vnni else 7)) - 1) - 1
    assert kernel.name == ("onednn-int8-vnni" if wmax == 127 else "onednn-int8-w7a8")
    scale = (weight.abs().amax(1) / wmax)
    wq = (weight / scale[:, None]).round().clamp(-wmax, wmax)
    low, high = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
    sx = (high - low) / 255
    zp = (-low / sx).round()
    xq = (x / sx + zp).round().clamp(0, 255)
    want = ((xq - zp) @ wq.T) * sx * scale + bias  # float64 would not change integer sums this small
    torch.testing.assert_close(kernel(x), want, rtol=1e-5, atol=1e-4)
    one_by_one = torch.cat([kernel(row[None]) for row in x])
    assert torch.equal(one_by_one, kernel(x)), "each row is quantized on its own"


def test_int8_kernel_sums_that_saturate_int16_stay_exact():
    """The case that broke without VNNI: every activation at 255 and weights at the extremes, so
    each pair of u8·s8 products exceeds int16 unless the variant bounds it."""
    wmax = 127 if cpu_features().vnni else 63
    weight = torch.full((4, 64), -1.0)
    weight[1] = 1.0
    weight[2, ::2] = 0.5
    x = torch.cat([torch.ones(1, 64), -torch.ones(1, 64)])  # xq = 255 everywhere; zero points 0 and 255
    scale = weight.abs().amax(1) / wmax
    dequantized = (weight / scale[:, None]).round() * scale[:, None]  # x itself survives quantization exactly
    torch.testing.assert_close(Int8Kernel(weight, None)(x), x @ dequantized.T, rtol=1e-5, atol=1e-4)


def test_int8_kernel_refuses_8_bit_weights_without_vnni():
    if cpu_features().vnni:
        pytest.skip(f"{cpu_features().describe()} has VNNI (SPECDEC_CPU_ISA=avx512 runs this check)")
    with pytest.raises(ValueError, match="need VNNI"):
        Int8Kernel(torch.randn(8, 8), None, weight_bits=8)


def test_bf16_says_when_it_is_emulated(caplog):
    """On a CPU without avx512_bf16/AMX, bf16 runs (its numbers track fp32: test_lossy_paths_track_fp32)
    with a warning and a kernel name that say it is emulated; with native bf16, neither."""
    with caplog.at_level(logging.WARNING, logger="specdec.engine.compute"):
        _, choice = build_runner(build_tiny_model("tiny:seed=0"), "bf16")
    emulated = not cpu_features().native_bf16
    assert (choice.kernel == "dense-emulated") == emulated
    assert ("is emulated" in caplog.text) == emulated, caplog.text


def test_kernels_pad_small_inputs_and_keep_leading_dims():
    weight = torch.randn(16, 8)
    kernel = make_kernel("fp32", weight, None, "onednn")
    x = torch.randn(2, 3, 8)
    assert kernel(x).shape == (2, 3, 16)
    torch.testing.assert_close(kernel(x[0, :1]), x[0, :1] @ weight.T, rtol=1e-5, atol=1e-5)


def test_kv_cache_grows_in_blocks_and_crops_without_copying():
    cache = KVCache(2, 1, 4, torch.float32, torch.device("cpu"), max_length=1000)
    cache.reserve(3)
    assert cache.capacity % BLOCK == 0 and cache.capacity >= 3
    cache.keys[:, :, :3] = 1.0
    cache.length = 3
    storage = cache.keys.data_ptr()
    assert cache.crop(1) == 2 and cache.length == 1 and cache.keys.data_ptr() == storage
    cache.length = 3
    cache.reserve(cache.capacity + 1)
    assert cache.keys.data_ptr() != storage and bool((cache.keys[:, :, :3] == 1.0).all())
    with pytest.raises(ValueError, match="context"):
        cache.reserve(1001)


def test_cost_profile_measures_every_size(monkeypatch):
    """Each size is timed as one forward of that many tokens after the PROFILE_CONTEXT prefix, best of
    the repeats: checked against a clock that each forward advances by a cost the test chose."""
    real = runner()
    real_forward = real.forward
    clock = [0.0]
    timed: dict[int, list[float]] = {}
    rng = torch.Generator().manual_seed(3)
    threads = set()

    def forward(steps):
        threads.add(threading.get_ident())
        size, before = sum(len(s.tokens) for s in steps), {s.cache.length for s in steps}
        out = real_forward(steps)
        if before == {0}:  # a prefix
            assert [len(s.tokens) for s in steps] == [PROFILE_CONTEXT]
            return out
        assert before == {PROFILE_CONTEXT} and all(s.logits == len(s.tokens) <= 4 for s in steps), \
            "a timed forward must follow the prefix alone, in sessions of at most max_tokens"
        assert len({id(s.cache) for s in steps}) == len(steps) == -(-size // 4)
        cost = 1e-3 * size * (1 + float(torch.rand((), generator=rng)))  # noisy, so "best of" matters
        timed.setdefault(size, []).append(cost)
        clock[0] += cost
        return out

    monkeypatch.setattr(real, "forward", forward)
    monkeypatch.setattr(measure_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    profile = measure(real, max_tokens=4, batch_tokens=16, repeats=2)
    assert profile.tokens == (1, 2, 3, 4, 8, 16)
    assert [len(timed[s]) for s in profile.tokens] == [3] * 6, "repeats, plus one warm-up each, shared passes too"
    assert profile.seconds == pytest.approx([min(timed[s]) for s in profile.tokens], rel=1e-9)
    assert threading.main_thread().ident not in threads, "timed where a service's passes run, off the initial thread"
    monkeypatch.undo()
    unpatched = measure(runner(), max_tokens=4, repeats=1)
    assert unpatched.tokens == (1, 2, 3, 4) and all(s > 0 for s in unpatched.seconds)
    assert CostProfile((1.0, 2.0)).forward_s(4) == 4.0, "past the measured sizes: linear extrapolation"


def test_the_profile_prices_attention_at_depth_from_passes_past_the_prefix(monkeypatch):
    """A clock whose passes cost 1 ms a token plus 20 ns per token and cached position past PROFILE_CONTEXT:
    the profile's per_position_s is those 20 ns, timed on sizes 1 and max_tokens at DEPTH_PROBE positions
    deeper, after which the caches are back at the prefix. A context too short to probe prices nothing."""
    real = runner(spec="tiny:seed=0,ctx=4096")
    real_forward, clock, depths = real.forward, [0.0], set()

    def forward(steps):
        before = steps[0].cache.length
        out = real_forward(steps)
        if before:  # a timed pass (the prefix is fed from an empty cache, uncounted)
            depths.add((sum(len(s.tokens) for s in steps), before))
            clock[0] += sum(len(s.tokens) * (1e-3 + 2e-8 * (before - PROFILE_CONTEXT)) for s in steps)
        return out

    monkeypatch.setattr(real, "forward", forward)
    monkeypatch.setattr(measure_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    profile = measure(real, max_tokens=4, batch_tokens=8, repeats=1)
    deep = PROFILE_CONTEXT + measure_module.DEPTH_PROBE
    assert {d for d in depths if d[1] != PROFILE_CONTEXT} == {(1, deep), (4, deep)}
    assert profile.per_position_s == pytest.approx(2e-8)
    assert profile.seconds == pytest.approx((1e-3, 2e-3, 3e-3, 4e-3, 8e-3)), "the sizes' own times at the prefix"
    assert profile.forward_s(4) + profile.depth_s(positions_past(4, 1128)) == pytest.approx(4e-3 + 4 * 1000 * 2e-8)
    monkeypatch.undo()
    assert measure(runner(), max_tokens=4, repeats=1).per_position_s == 0.0, "a 512-position context: not probed"
    timer = measure_module.PassTimer(runner(spec="tiny:seed=0,ctx=4096"), 4, 4)
    assert timer.deepen(10_000) == 4096 - PROFILE_CONTEXT - 4 and timer.caches[0].length == 4096 - 4
    assert timer.seconds(4) > 0 and timer.caches[0].length == 4096 - 4, "a pass at depth, cropped back to it"
    assert timer.deepen(0) == 0 and timer.caches[0].length == PROFILE_CONTEXT


def test_a_pass_preempted_in_every_repeat_does_not_make_fewer_tokens_cost_more(monkeypatch):
    """Beside busy loops a small size's best can be a preempted pass (10 ms on a 2 ms step): each size is
    capped by every larger one's, so a target-only step never prices above a verify of several tokens."""
    spiked = {1: 0.027, 3: 0.011}  # every repeat of sizes 1 and 3 preempted
    monkeypatch.setattr(measure_module.PassTimer, "seconds", lambda self, size: spiked.get(size, 0.002 + 1e-4 * size))
    profile = measure(runner(), max_tokens=4, repeats=2)
    assert profile.seconds == pytest.approx((0.0022, 0.0022, 0.0024, 0.0024))
    assert measure_module.monotone([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 1.0, 2.0, 4.0, 4.0)


def test_path_flags_and_unsupported_models():
    assert resolve_path("auto", "none", "cpu") == "fp32"
    assert resolve_path("bfloat16", "none", "cpu") == "bf16"
    assert resolve_path("auto", "int8", "cpu") == "int8"
    assert resolve_path("auto", "none", "cuda") == "bf16"
    with pytest.raises(ValueError, match="CPU path"):
        resolve_path("auto", "int8", "cuda")
    model = build_tiny_model("tiny:seed=0")
    model.model.layers[0].self_attn = torch.nn.Identity()
    with pytest.raises(UnsupportedModel):
        ModelRunner(copy.deepcopy(model))
