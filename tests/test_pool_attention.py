"""The static runner's Triton attention over its KV pool (`specdec.engine.cuda.pool_attention`): on a GPU for
real, on a CPU through Triton's interpreter (float32 dots there). What it computes (each row's softmax over its
slot's keys up to its own position), that a row's bits are its own (its place in the segment, the batch, the
keys past its position and the pool's length change nothing), and the runner with it: invariant as with the
other kernel, and computing what that kernel computes."""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("triton")  # on a CPU its kernels run in Triton's interpreter (TRITON_INTERPRET, set by conftest)

from specdec.engine.cuda import pool_attention as kernel  # noqa: E402
from specdec.engine.cuda.pool_attention import pool_attention  # noqa: E402
from specdec.engine.models import load_hf_model  # noqa: E402
from specdec.engine.static.runner import StaticRunner  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
H, KV, D, S = 6, 2, 32, 4  # 3 query heads a KV head, segments of 4 rows
SCALE = D ** -0.5


def _pool(slots: int = 4, length: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(slots, length, KV, D, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
    return keys, values


def _queries(segments: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(H, segments * S, D, generator=gen).to(DEVICE, torch.bfloat16)


def _run(q, keys, values, positions: list[list[int]], slots: list[int], window: int | None = None) -> torch.Tensor:
    """The kernel over a window of `window` keys (default: the whole pool)."""
    return pool_attention(q, keys, values, torch.tensor(positions, device=DEVICE),
                          torch.tensor(slots, device=DEVICE), SCALE, window or keys.shape[1])  # [B·S, H·D]


@pytest.fixture(params=[64, 128, 1024], ids=lambda n: f"parts_of_{n}")
def split_n(request, monkeypatch):
    """Walks split into parts of 64 or 128 keys (5 or 3 parts over the pool of 300), or not at all."""
    monkeypatch.setattr(kernel, "SPLIT_N", request.param)
    return request.param


def test_each_row_attends_over_its_slots_keys_up_to_its_own_position(split_n):
    keys, values = _pool()
    positions, slots = [[0, 1, 2, 3], [60, 61, 62, 63], [62, 63, 64, 65], [201, 202, 203, 204]], [2, 0, 3, 0]
    q = _queries(len(slots))
    out = _run(q, keys, values, positions, slots).float().cpu()
    for b, (rows, slot) in enumerate(zip(positions, slots)):
        for s, position in enumerate(rows):
            for head in range(H):
                k = keys[slot, :position + 1, head // (H // KV)].float().cpu()
                v = values[slot, :position + 1, head // (H // KV)].float().cpu()
                weights = torch.softmax(q[head, b * S + s].float().cpu() @ k.T * SCALE, -1)
                torch.testing.assert_close(out[b * S + s, head * D:(head + 1) * D], weights @ v, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("position", [70, 200])
def test_a_rows_bits_are_its_own(split_n, position):
    """The row at `position` of slot 1: first or last in its segment (a step or a verify's later row),
    alone or beside other segments, with other keys past its position, in a longer pool, and over any window
    that holds it (split in parts or not: the shortest here is walked whole, the longest in parts)."""
    keys, values = _pool()
    q = _queries(3)
    row = q[:, 2 * S:2 * S + 1]  # [H, 1, D]: the third segment's first row

    def at(index: int, positions, slots, k=keys, v=values, segments=1, window=None) -> torch.Tensor:
        queries = _queries(segments, seed=5)
        queries[:, index] = row[:, 0]
        return _run(queries, k, v, positions, slots, window)[index]

    steps = [position + i for i in range(S)]
    alone = at(0, [steps], [1], window=position + S)
    for window in (256, 300):
        assert torch.equal(at(0, [steps], [1], window=window), alone), f"a window of {window} changed it"
    p = position
    assert torch.equal(at(S - 1, [[p - 3, p - 2, p - 1, p]], [1]), alone), "its place in the segment changed it"
    assert torch.equal(at(2 * S, [[5, 6, 7, 8], [300 - S + i for i in range(S)], steps], [0, 3, 1], segments=3),
                       alone), "its neighbours changed it"
    later_keys, later_values = keys.clone(), values.clone()
    later_keys[1, p + 1:], later_values[1, p + 1:] = 7.0, -7.0
    assert torch.equal(at(0, [[p, 250, 280, 299]], [1], later_keys, later_values), alone), \
        "keys past its position, or a longer walk for the segment's other rows, changed it"
    longer_keys, longer_values = (torch.cat([t, torch.zeros_like(t)], dim=1) for t in (keys, values))
    assert torch.equal(at(0, [steps], [1], longer_keys, longer_values), alone), "the pool's length changed it"


@pytest.fixture(scope="module")
def runners():
    """The same tiny model under the pool kernel and under scaled_dot_product_attention."""
    def build(attention: str) -> StaticRunner:
        model = load_hf_model("tiny:seed=0", DEVICE, torch.float32)
        return StaticRunner(model, "fp32", slots=13, graphs=False, compile=False, attention=attention)
    return build("pool"), build("sdpa")


def test_the_runner_computes_with_it_what_it_computes_with_sdpa(runners):
    from test_static_runner import PROMPT, _decode

    pool, sdpa = runners
    assert (pool.attention, sdpa.attention) == ("pool", "sdpa")
    mine, my_rows = _decode(pool, PROMPT, 12)
    theirs, their_rows = _decode(sdpa, PROMPT, 12)
    assert mine == theirs
    for a, b in zip(my_rows, their_rows, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_with_it_a_tokens_logits_do_not_depend_on_gamma_or_the_other_sessions(runners):
    """On a CPU in float32 (its row-invariant dense path); on a GPU in bfloat16, as the GPU runs (cuBLAS's float32
    products are not row-invariant there)."""
    from test_static_runner import _assert_row_invariant

    if DEVICE.type == "cuda":
        model = load_hf_model("tiny:seed=0", DEVICE, torch.bfloat16)
        _assert_row_invariant(StaticRunner(model, "bf16", slots=13, graphs=False, compile=False, attention="pool"))
    else:
        _assert_row_invariant(runners[0])


def test_a_runner_refuses_an_attention_it_does_not_have():
    with pytest.raises(ValueError, match="'pool' or 'sdpa'"):
        StaticRunner(load_hf_model("tiny:seed=0", DEVICE, torch.float32), "fp32", slots=2, attention="flash")


def test_the_split_setting_takes_a_multiple_of_a_block_and_refuses_anything_else():
    assert kernel._split_n("256") == 256 and kernel._split_n("65536") == 65536
    for setting in ("0", "100", "-64", "", "2k"):
        with pytest.raises(ValueError, match="SPECDEC_POOL_SPLIT_N must be a positive multiple of 64"):
            kernel._split_n(setting)
