"""Weights that a pass streams, on 2 MiB pages where the kernel allows it.

A decode step reads every weight once, about a gigabyte for the 1.5B target. On 4 KiB pages that is a TLB
miss every 4 KiB, and the hardware prefetchers stop at each page's end. Where transparent huge pages are
"madvise" (the common default), memory gets them only when asked. torch's allocator does not ask (numpy's
does, which is why the exact gguf path had them by accident for its unfused weights, and the integer path not
at all). Measured on a
Zen 4 (docs/PERFORMANCE.md), a 155 MB Q4_K matrix on the integer kernel: 1 row 7.95 -> 7.07 ms, 5 rows
24.4 -> 20.5 ms.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

HUGE_PAGE = 2 << 20


def empty_on_huge_pages(rows: int, cols: int) -> torch.Tensor:
    """An uninitialised uint8 [rows, cols] tensor whose whole 2 MiB stretches are advised onto huge pages.

    The memory is a private anonymous mapping, 2 MiB longer than asked so that the tensor can start on a
    2 MiB boundary; only its whole 2 MiB stretches are advised, so the tail never rounds up to a huge page
    (resident memory stays what is touched). Tensors under 2 MiB get torch's memory; where the system has
    no huge pages the mapping serves unadvised. The tensor keeps the mapping alive; it is unmapped when the
    last view of it goes.
    """
    size = rows * cols
    if size < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(rows, cols, dtype=torch.uint8)
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, start, size // HUGE_PAGE * HUGE_PAGE)
    except OSError:  # a kernel built without transparent huge pages: the memory serves as it is
        pass
    return whole[start:start + size].view(rows, cols)


def return_freed_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).

    Loading a GGUF model frees temporaries on the heap, and nothing after it reuses that space, since the
    weights live in their own mappings: without this the loaded 1.5B target keeps about 90 MB more resident
    (1.63 against 1.54 GB).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
