"""The gguf-q8 path's float steps in C (`csrc/layer_ops.c`): RMS norm, SiLU gating and attention.

Each is checked bit for bit against a numpy float32 transcription of the definition in the source's
header (numpy rounds every float32 operation on its own, as the library's no-contraction build does), on
every build this CPU can run; rows and queries against themselves computed alone; and the model on
them against the same model on torch ops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import GGUF_TARGET
from test_q8dot import VARIANTS

from specdec.engine.cpu import q8dot
from specdec.engine.cpu.layer_ops import FusedLayers
from specdec.engine.models import load_model
from specdec.engine.runner import Step

f32, f16 = np.float32, np.float16


# -- the definition, transcribed ------------------------------------------------------------------------
def lane_sum(values: np.ndarray) -> np.float32:
    """Σ values (float32) as 16 lanes fed in order (element k to lane k mod 16), then summed by halves."""
    lanes = np.zeros(16, f32)
    padded = np.concatenate([values.astype(f32), np.zeros(-len(values) % 16, f32)])
    for chunk in padded.reshape(-1, 16):
        lanes = lanes + chunk
    h = lanes[:8] + lanes[8:]
    q = h[:4] + h[4:]
    return (q[0] + q[2]) + (q[1] + q[3])


def exp_definition(x: np.ndarray) -> np.ndarray:
    x = x.astype(f32)
    tiny = x < f32(-87.3)
    x = np.where(tiny, f32(0), np.where(x > f32(88.3), f32(88.3), x))
    shift = f32(12582912.0)
    n = (x * f32(1.44269504088896341) + shift) - shift
    r = (x - n * f32(0.693359375)) - n * f32(-2.12194440e-4)
    y = f32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = y * r + f32(c)
    y = (y * (r * r) + r) + f32(1)
    two_n = ((n.astype(np.int32) + 127) << 23).view(f32)
    return np.where(tiny, f32(0), y * two_n)


def rms_norm_definition(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    for s, row in enumerate(x):
        r = f32(1) / np.sqrt(lane_sum(row * row) / f32(len(row)) + f32(eps))
        out[s] = w * (row * r)
    return out


def rotary_definition(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = len(x) // 2
    first, second = x[:half] * cos[:half] - x[half:] * sin[:half], x[half:] * cos[half:] + x[:half] * sin[half:]
    return np.concatenate([first, second])


def attention_definition(qkv, heads, kv_heads, dim, past_keys, past_values, cos, sin, scale, norms=None, eps=0.0):
    """qkv [S, (H + 2·KV)·D] of positions [P, P + S) after past keys / values [KV, P, D] (already embedded,
    float16) → out [S, H·D], and the keys and values [KV, P + S, D] after them (float16: numpy rounds to the
    nearest half, ties to even, as the cache's definition does)."""
    S, P, G = qkv.shape[0], past_keys.shape[1], heads // kv_heads
    norm = (lambda v, w: rms_norm_definition(v[None], w, eps)[0]) if norms else (lambda v, w: v)
    keys, values = np.concatenate([past_keys, np.zeros((kv_heads, S, dim), f16)], 1), np.concatenate(
        [past_values, np.zeros((kv_heads, S, dim), f16)], 1)
    for s in range(S):
        for kv in range(kv_heads):
            k = qkv[s, (heads + kv) * dim:(heads + kv + 1) * dim]
            keys[kv, P + s] = rotary_definition(norm(k, norms and norms[1]), cos[s], sin[s])
            values[kv, P + s] = qkv[s, (heads + kv_heads + kv) * dim:(heads + kv_heads + kv + 1) * dim]
    out = np.empty((S, heads * dim), f32)
    for s in range(S):
        for head in range(heads):
            q = rotary_definition(norm(qkv[s, head * dim:(head + 1) * dim], norms and norms[0]), cos[s], sin[s])
            n, kv = P + s + 1, head // G
            scores = np.array([lane_sum(q * keys[kv, j].astype(f32)) * f32(scale) for j in range(n)], f32)
            e = exp_definition(scores - scores.max())
            acc = np.zeros(dim, f32)
            for j in range(n):
                acc = acc + e[j] * values[kv, j].astype(f32)
            out[s, head * dim:(head + 1) * dim] = acc / lane_sum(e)
    return out, keys, values


# -- calling the library --------------------------------------------------------------------------------
def ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def rms_norm(lib, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    lib.lo_rms_norm(ptr(x), x.shape[0], x.shape[1], ptr(w), eps, ptr(out))
    return out


def silu_mul(lib, gate_up: torch.Tensor) -> torch.Tensor:
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2)
    lib.lo_silu_mul(ptr(gate_up), gate_up.shape[0], gate_up.shape[1] // 2, ptr(out))
    return out


class Attention:
    """One layer's cache [KV, capacity, D] (float16) and the library's attention over it."""

    def __init__(self, lib, heads, kv_heads, dim, capacity=96, norms=None, eps=1e-6, threads=2):
        self.lib, self.heads, self.kv_heads, self.dim, self.norms, self.eps = lib, heads, kv_heads, dim, norms, eps
        self.keys = torch.zeros(kv_heads, capacity, dim, dtype=torch.float16)
        self.values = torch.zeros(kv_heads, capacity, dim, dtype=torch.float16)
        self.length, self.threads = 0, threads

    def __call__(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float) -> torch.Tensor:
        out = torch.empty(qkv.shape[0], self.heads * self.dim)
        q_norm, k_norm = self.norms or (None, None)
        status = self.lib.lo_attention(ptr(qkv), qkv.shape[0], self.heads, self.kv_heads, self.dim, ptr(q_norm),
                                       ptr(k_norm), self.eps, ptr(cos), ptr(sin), ptr(self.keys), ptr(self.values),
                                       self.keys.shape[1], self.length, scale, ptr(out), self.threads)
        assert status == 0
        self.length += qkv.shape[0]
        return out


def rotary_tables(positions: range, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.tensor(list(positions)).float()[:, None] * inv[None]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().contiguous(), angles.sin().contiguous()


def attention_inputs(S: int, heads: int, kv_heads: int, dim: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(S, (heads + 2 * kv_heads) * dim, generator=torch.Generator().manual_seed(seed)) * 2


# -- the steps ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_norm_and_gating_compute_their_definition_bit_for_bit(variant):
    """Widths with and without a partial 16-lane tail; gate values past exp's range both ways."""
    lib = q8dot.library(variant)
    gen = torch.Generator().manual_seed(1)
    for width in (1536, 200, 7):
        x, w = torch.randn(5, width, generator=gen) * 3, torch.randn(width, generator=gen)
        assert torch.equal(rms_norm(lib, x, w, 1e-6), torch.from_numpy(rms_norm_definition(x.numpy(), w.numpy(), 1e-6)))
        gate_up = torch.randn(5, 2 * width, generator=gen) * 8
        gate_up[0, :4] = torch.tensor([-200.0, -88.0, 90.0, 300.0])
        gate, up = gate_up.numpy()[:, :width], gate_up.numpy()[:, width:]
        want = (gate / (f32(1) + exp_definition(-gate))) * up
        assert torch.equal(silu_mul(lib, gate_up), torch.from_numpy(want))


def test_exp_is_close_to_the_true_exp():
    x = np.linspace(-87, 88, 200001, dtype=f32)
    relative = np.abs(exp_definition(x).astype(np.float64) / np.exp(x.astype(np.float64)) - 1)
    assert relative.max() < 3e-7
    assert exp_definition(np.array([-88.0, -1000.0], f32)).tolist() == [0.0, 0.0]


SHORT, LONG = [(0, 21), (21, 25)], [(0, 70), (70, 73)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("heads,kv_heads,dim,head_norms,spans",
                         [(4, 2, 16, False, SHORT), (6, 3, 32, True, SHORT), (2, 2, 64, False, SHORT),
                          (3, 1, 32, False, SHORT), (14, 2, 64, False, LONG), (12, 2, 80, False, LONG),
                          (5, 1, 16, False, LONG)])
def test_attention_computes_its_definition_bit_for_bit(variant, heads, kv_heads, dim, head_norms, spans):
    """A prefill then a verify (21 tokens then 4; or 70 then 3), grouped heads (all of them on one KV head in
    some cases), with and without per-head norms; the cache holds the embedded keys and the values. Past 16
    keys the scores go in blocks of 16 keys and pairs of heads (an odd head alone), and the values in groups
    of heads and of 4 chunks of 16 dimensions (a remainder chunk alone when the head size is not a multiple
    of 64)."""
    lib = q8dot.library(variant)
    gen = torch.Generator().manual_seed(dim)
    norms = (torch.rand(dim, generator=gen) + 0.5, torch.rand(dim, generator=gen) + 0.5) if head_norms else None
    attention = Attention(lib, heads, kv_heads, dim, norms=norms)
    keys, values = np.zeros((kv_heads, 0, dim), f16), np.zeros((kv_heads, 0, dim), f16)
    for seed, (begin, end) in enumerate(spans):
        qkv = attention_inputs(end - begin, heads, kv_heads, dim, seed)
        cos, sin = rotary_tables(range(begin, end), dim)
        got = attention(qkv, cos, sin, dim ** -0.5)
        want, keys, values = attention_definition(
            qkv.numpy(), heads, kv_heads, dim, keys, values, cos.numpy(), sin.numpy(), dim ** -0.5,
            norms=norms and tuple(n.numpy() for n in norms), eps=1e-6)
        assert torch.equal(got, torch.from_numpy(want))
        assert torch.equal(attention.keys[:, :end], torch.from_numpy(keys))
        assert torch.equal(attention.values[:, :end], torch.from_numpy(values))


# Halves around each rounding edge: the largest, ties past it and to inf, subnormals and the ties between
# them, the last value below the smallest normal, ties at 1, a signed zero, a float32 subnormal.
FINITE_EDGES = [65504.0, 65519.99, -65504.0, 1e-8, 2**-25, 1.5 * 2**-25, 3 * 2**-25, 2**-14 * (1 - 2**-12),
                1 + 2**-11, 1 + 3 * 2**-11, -0.0, 1e-40, 0.1, -2.5, 7e-6, 3.0]
EDGES = FINITE_EDGES[:12] + [65520.0, -7e4, float("inf"), float("nan")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_cache_holds_halves_rounded_as_ieee_rounds_and_reads_them_back_exactly(variant):
    """Values written into the cache are the nearest halves (ties to even, past 65504 infinite, NaN a NaN),
    bit for bit what torch's own conversion gives, on every build; and attention over a cache of such
    halves (subnormals, the largest, a signed zero) computes its definition on every build."""
    lib = q8dot.library(variant)
    cos, sin = rotary_tables(range(2), 16)
    attention = Attention(lib, 1, 1, 16, threads=1)
    qkv = torch.zeros(1, 3 * 16)
    qkv[0, 32:] = torch.tensor(EDGES)
    attention(qkv, cos[:1], sin[:1], 0.25)
    assert torch.equal(attention.values[0, 0].view(torch.int16), torch.tensor(EDGES).half().view(torch.int16))

    attention = Attention(lib, 2, 1, 16, threads=1)
    qkv = attention_inputs(2, 2, 1, 16)
    qkv[:, 32:48] = torch.tensor(FINITE_EDGES)  # both tokens' keys (before the rotary embedding)
    qkv[:, 48:] = torch.tensor(FINITE_EDGES[::-1])  # and values
    got = attention(qkv, cos, sin, 0.25)
    want, _, _ = attention_definition(qkv.numpy(), 2, 1, 16, np.zeros((1, 0, 16), f16), np.zeros((1, 0, 16), f16),
                                      cos.numpy(), sin.numpy(), 0.25)
    assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("threads", [1, 2])
def test_each_query_is_the_same_whatever_it_is_computed_with(threads):
    """After a 40-token prefix, 1..9 new tokens at once give each token the bits it gets alone."""
    lib = q8dot.library()
    heads, kv_heads, dim = 12, 2, 128
    prefix, new = attention_inputs(40, heads, kv_heads, dim, 0), attention_inputs(9, heads, kv_heads, dim, 1)
    cos, sin = rotary_tables(range(49), dim)

    def run(chunks: list[int]) -> torch.Tensor:
        attention = Attention(lib, heads, kv_heads, dim, threads=threads)
        attention(prefix, cos[:40], sin[:40], 0.1)
        outs, at = [], 40
        for size in chunks:
            outs.append(attention(new[at - 40:at - 40 + size], cos[at:at + size], sin[at:at + size], 0.1))
            at += size
        return torch.cat(outs)

    alone = run([1] * 9)
    for size in range(2, 10):
        assert torch.equal(run([size] + [1] * (9 - size))[:size], alone[:size]), f"{size} at once"


@pytest.mark.parametrize("heads,kv_heads,dim,start", [(4, 2, 24, 0), (4, 3, 32, 0), (4, 2, 32, 95)])
def test_attention_refuses_shapes_it_does_not_take(heads, kv_heads, dim, start):
    """A head size off the 16-lane grid, query heads not a multiple of KV heads, a cache too short."""
    qkv, (cos, sin) = attention_inputs(2, heads, kv_heads, dim), rotary_tables(range(2), dim)
    cache, out = torch.zeros(kv_heads, 96, dim, dtype=torch.float16), torch.empty(2, heads * dim)
    status = q8dot.library().lo_attention(ptr(qkv), 2, heads, kv_heads, dim, None, None, 0.0, ptr(cos), ptr(sin),
                                          ptr(cache), ptr(cache), 96, start, 1.0, ptr(out), 1)
    assert status == -1


# -- the model on them ----------------------------------------------------------------------------------
def test_the_integer_path_runs_its_layers_on_the_c_steps_and_they_track_torch_ops():
    """The tiny GGUF model on gguf-q8 uses the C steps; on the exact kernels, the C steps and the torch
    ops give nearly the same logits (they round differently, and the C steps keep the cache in halves: keys
    and values within 2^-12 of themselves, logits within about 0.01 of a spread of 3), and greedy choices
    agree."""
    q8 = load_model(GGUF_TARGET, "cpu")
    assert q8.runner.fused is not None
    exact = load_model(GGUF_TARGET, "cpu", dtype="gguf").runner
    assert exact.fused is None
    tokens = [5, 17, 101, 3, 250, 42, 7, 9, 11, 13, 200, 31]
    on_torch = exact.forward([Step(exact.new_cache(), tokens, logits=len(tokens))])[0]
    exact.fused = FusedLayers(exact, q8dot.library())
    assert exact.fused.compiled is None  # its kernels are not the integer ones: the layer-by-layer loop
    cache = exact.new_cache()
    on_c = torch.cat([exact.forward([Step(cache, tokens[:8], logits=8)])[0],
                      exact.forward([Step(cache, tokens[8:], logits=4)])[0]])
    assert cache.keys.dtype == torch.float16
    torch.testing.assert_close(on_c, on_torch, rtol=0, atol=0.03)
    assert torch.equal(on_c.argmax(-1), on_torch.argmax(-1))


@pytest.mark.parametrize("head_norms", [False, True], ids=["qwen2", "query-key-norms"])
def test_the_layers_in_one_c_call_give_the_layer_loops_bits(head_norms):
    """The whole layer loop in one C call (`decoder.c`) against the loop that calls each step from Python:
    the same logits and the same cache contents, bit for bit, for three sessions of different lengths in
    one pass (a verify, a draft step and a prefill), on caches with a past."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    runner = load_model(GGUF_TARGET, "cpu").runner
    if head_norms:  # Qwen3's per-head norms, one epsilon for both
        generator = torch.Generator().manual_seed(3)
        for layer in runner.layers:
            layer.q_norm, layer.k_norm = Qwen3RMSNorm(runner.head_dim, 1e-6), Qwen3RMSNorm(runner.head_dim, 1e-6)
            for norm in (layer.q_norm, layer.k_norm):
                norm.weight.data = torch.rand(runner.head_dim, generator=generator) + 0.5
        runner.fused = FusedLayers(runner, q8dot.library())
    compiled = runner.fused.compiled
    assert compiled is not None
    tokens = [5, 17, 101, 3, 250, 42, 7, 9, 11, 13, 200, 31]
    results = []
    for loop in (None, compiled):
        runner.fused.compiled = loop
        caches = [runner.new_cache() for _ in range(3)]
        runner.forward([Step(caches[0], tokens[:7]), Step(caches[1], tokens[:3])])
        logits = runner.forward([Step(caches[0], tokens[7:12], logits=5), Step(caches[1], tokens[3:4], logits=1),
                                 Step(caches[2], tokens[:9], logits=9)])
        kept = [(c.keys[:, :, :c.length].clone(), c.values[:, :, :c.length].clone()) for c in caches]
        results.append((logits, kept))
    (by_python, python_caches), (in_c, c_caches) = results
    assert all(torch.equal(a, b) for a, b in zip(by_python, in_c))
    assert all(torch.equal(a, b) for pair_a, pair_b in zip(python_caches, c_caches) for a, b in zip(pair_a, pair_b))


def test_models_the_c_steps_do_not_cover_run_on_torch_ops():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from specdec.engine.cpu.layer_ops import unsupported_reason

    model = load_model(GGUF_TARGET, "cpu")
    runner = model.runner
    assert unsupported_reason(runner) is None
    runner.layers[0].q_norm, runner.layers[0].k_norm = Qwen2RMSNorm(32, eps=1e-6), Qwen2RMSNorm(32, eps=1e-5)
    assert unsupported_reason(runner) == "its query and key norms have different epsilons (the C attention takes one)"
    runner.layers[0].act = torch.nn.GELU()
    assert unsupported_reason(runner) == "its MLP activation is not SiLU"
