"""The gguf paths' weights on 2 MiB pages (`specdec.engine.cpu.hugepages`): what is advised, and what is not."""

from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.engine.cpu.hugepages import HUGE_PAGE, empty_on_huge_pages, return_freed_heap

needs_thp = pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").exists(),
                               reason="no transparent huge pages in this kernel")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds `address` in this process."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            begin, end = (int(part, 16) for part in head.split("-"))
            inside = begin <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@needs_thp
def test_whole_huge_pages_are_advised_and_the_tail_is_not():
    rows, cols = 3, HUGE_PAGE + 12_345  # 3 whole huge pages and a tail of 37,035 bytes
    weights = empty_on_huge_pages(rows, cols)
    assert weights.shape == (rows, cols) and weights.dtype == torch.uint8
    assert weights.data_ptr() % HUGE_PAGE == 0
    assert "hg" in vm_flags(weights.data_ptr())
    assert "hg" in vm_flags(weights.data_ptr() + 3 * HUGE_PAGE - 1)
    assert "hg" not in vm_flags(weights.data_ptr() + rows * cols - 1)  # never rounded up to a huge page


def test_the_memory_holds_what_is_written_after_the_mapping_object_is_gone():
    values = np.random.default_rng(0).integers(0, 256, size=(2, HUGE_PAGE), dtype=np.uint8)
    weights = empty_on_huge_pages(*values.shape)
    weights.numpy()[:] = values
    rows = weights[1:]  # a view keeps the mapping alive on its own
    del weights
    return_freed_heap()
    assert np.array_equal(rows.numpy(), values[1:])


def test_small_tensors_get_torchs_memory():
    # Whether torch's heap is advised is the allocator's business (numpy's and torch's own THP option advise
    # what they allocate, and a small tensor may land there): what is ours is that no mapping is made for it.
    small = empty_on_huge_pages(4, 1000)
    assert small.shape == (4, 1000) and small.is_contiguous()
    assert small.untyped_storage().nbytes() == 4000
    large = empty_on_huge_pages(1, HUGE_PAGE)
    assert large.untyped_storage().nbytes() == 2 * HUGE_PAGE  # the mapping, a huge page longer than asked


@needs_thp
def test_gguf_weights_are_read_where_they_lie_and_kept_once_on_advised_memory():
    """A GGUF tensor is a view of its bytes; what a kernel or an embedding keeps is one copy on advised memory:
    stacked runs, a lone part, gguf-q8's repack (each part straight into its rows), the embedding table."""
    from specdec.engine.cpu import blockquant, q8dot
    from specdec.engine.cpu.blockquant import Q4_K, BlockTensor, stack_rows

    if not q8dot.available():
        pytest.skip("no integer kernel here")
    rows, cols = 2048, 4096  # 9.4 MB of Q4_K blocks
    raw = np.random.default_rng(1).integers(0, 256, size=(rows, cols // 256 * 144), dtype=np.uint8)
    blocks = BlockTensor.from_numpy(Q4_K, raw, cols)
    assert np.shares_memory(blocks.data.numpy(), raw), "a file's blocks are read where they lie, not copied"
    parts = [blocks, *(BlockTensor.from_numpy(Q4_K, raw[:n], cols) for n in (1024, 512))]  # q, k, v
    [fused] = stack_rows(parts)
    [alone] = stack_rows([blocks])  # an exact kernel's lone part is copied too
    assert np.array_equal(fused.data.numpy(), np.concatenate([raw, raw[:1024], raw[:512]]))
    assert np.array_equal(alone.data.numpy(), raw) and not np.shares_memory(alone.data.numpy(), raw)
    lib = q8dot.library()
    repacked = q8dot.RepackedTensor.of(parts, lib)  # each part repacked into its rows: the stacked parts' bytes
    assert torch.equal(repacked.data, q8dot.RepackedTensor.of([fused], lib).data)
    table = blockquant.BlockEmbedding(blocks).table  # an embedding keeps no view of the file's mapping
    assert torch.equal(table.data, blocks.data) and not np.shares_memory(table.data.numpy(), raw)
    for tensor in (fused.data, alone.data, repacked.data, table.data):
        assert tensor.data_ptr() % HUGE_PAGE == 0 and "hg" in vm_flags(tensor.data_ptr())
