"""One session's KV cache: keys and values for every layer, written in place by position.

Rolling back is `crop(n)`: the length moves back and the next forward overwrites the stale
entries, with no copy (gpt-fast, vLLM and SGLang do the same). Storage grows by doubling, so
appending costs amortised O(1) instead of the full-cache `torch.cat` of `DynamicCache`.
"""

from __future__ import annotations

import torch

from specdec.core.errors import ResourceExhausted
from specdec.engine import memory_budget
from specdec.engine.attention import BLOCK

# What a CPU cache's growth leaves the machine: a pass's activations and logits (a 256-token chunk's over a 152k
# vocabulary alone is 155 MB), the other services' work, the page cache the weights are read through.
HEADROOM_BYTES = 512 * 2**20


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 max_length: int, shards=None):
        """`shards`: a tensor-parallel shard's `Collectives` (`specdec.engine.runner`), whose ranks check growth
        together (`_check_memory`); None for a whole model's cache."""
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device, self.max_length = dtype, device, max_length
        self.check_memory = device.type == "cpu"  # `reserve`'s check
        self.shards = shards
        self.length = 0  # positions [0, length) hold valid entries
        self.keys = self.values = self._storage(0)  # [layers, kv_heads, capacity, head_dim]

    def _storage(self, capacity: int) -> torch.Tensor:
        layers, kv_heads, head_dim = self.shape
        # Zeroed: attention reads whole blocks, and a masked entry must still be finite (0·NaN = NaN).
        return torch.zeros(layers, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, length: int) -> None:
        """Make room for positions [0, length); existing entries are kept. On CPU (`check_memory`),
        ResourceExhausted (and nothing changed) where the machine has not the memory for the larger storage and
        HEADROOM_BYTES besides: a session refused, where the allocation would have ended in the OOM killer for every
        session."""
        if length <= self.capacity:
            return
        if length > self.max_length:
            raise ValueError(f"KV cache of {length} positions exceeds the model's context of {self.max_length}")
        capacity = min(max(length, 2 * self.capacity), self.max_length)
        capacity = -(-capacity // BLOCK) * BLOCK  # attention reads whole blocks
        if self.check_memory:
            self._check_memory(capacity)
        keys, values = self._storage(capacity), self._storage(capacity)
        keys[:, :, :self.length] = self.keys[:, :, :self.length]
        values[:, :, :self.length] = self.values[:, :, :self.length]
        self.keys, self.values = keys, values

    def _check_memory(self, capacity: int) -> None:
        """ResourceExhausted unless the machine has the memory for the storage at `capacity` and HEADROOM_BYTES.
        A tensor-parallel shard's ranks check at the same point of the same command (their caches are alike):
        each for every shard its machine holds, and all refuse where one would, since one rank refusing a growth
        the others made would leave them waiting in the pass's collectives."""
        copies = 1 if self.shards is None else self.shards.ranks_here()
        what = f"a KV cache of {capacity} positions" + (f" ({copies} shards on this machine)" if copies > 1 else "")
        try:
            memory_budget.check_fits(what, self._bytes(capacity) * copies + HEADROOM_BYTES,
                                     f" ({HEADROOM_BYTES // 2**20} MiB of it left for the passes)")
            refusal = None
        except memory_budget.NotEnoughMemory as error:
            refusal = str(error)
        if self.shards is not None and not self.shards.agree(refusal is None):
            refusal = refusal or f"a KV cache of {capacity} positions: another tensor-parallel rank's machine has " \
                                 "not the memory for its shard"
        if refusal is not None:
            raise ResourceExhausted(refusal)

    def crop(self, length: int) -> int:
        """Forget positions from `length` on; returns how many were dropped."""
        dropped = max(self.length - length, 0)
        self.length -= dropped
        return dropped

    def _bytes(self, capacity: int) -> int:
        """Keys and values at `capacity` positions."""
        layers, kv_heads, head_dim = self.shape
        return 2 * layers * kv_heads * capacity * head_dim * self.dtype.itemsize

    def nbytes(self) -> int:
        return self._bytes(self.capacity)

    def own_bytes(self) -> int:
        """Memory that dropping this cache frees: all of it."""
        return self.nbytes()
