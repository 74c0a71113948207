"""A KV pool preallocated for every session: keys and values, per layer, of [slots + 1, length, kv_heads, head_dim].

A session owns a slot (`SlotCache`); rolling back is setting its length, and releasing it returns the
slot. The last slot is scratch: padding sessions of a bucket write there, so no real slot is touched.

Each layer's keys and values are a tensor of their own, not a view of one [layers, ...] tensor: compiled,
a write into a view of a shared base is made functional as a scatter into the whole base and a copy of it
back (the pool, every step); a write into a tensor of its own becomes one in-place `index_put_`.
"""

from __future__ import annotations

import threading
import weakref

import torch

from specdec.core.errors import ResourceExhausted


class KVPool:
    def __init__(self, layers: int, slots: int, length: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (slots + 1, length, kv_heads, head_dim)
        # Zeroed: attention reads whole rows of keys, and a masked entry must still be finite (0·NaN = NaN).
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slots, self.length, self.scratch = slots, length, slots
        self._free = list(range(slots - 1, -1, -1))
        self._lock = threading.Lock()

    def allocate(self, max_length: int) -> SlotCache:
        """A slot for a new session; ResourceExhausted when every slot is taken."""
        with self._lock:
            if not self._free:
                raise ResourceExhausted(f"the KV pool's {self.slots} slots are all in use")
            slot = self._free.pop()
        cache = SlotCache(slot, max_length, self.slot_bytes())
        weakref.finalize(cache, self._release, slot)  # freed when the session lets go of its cache
        return cache

    def _release(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    @property
    def free_slots(self) -> int:
        with self._lock:
            return len(self._free)

    def slot_bytes(self) -> int:
        return 2 * sum(layer[0].numel() * layer.element_size() for layer in self.keys)


class SlotCache:
    """One session's view of the pool: its slot and how many positions [0, length) hold valid entries."""

    def __init__(self, slot: int, max_length: int, nbytes: int):
        self.slot, self.max_length, self._nbytes = slot, max_length, nbytes
        self.length = 0

    def reserve(self, length: int) -> None:
        if length > self.max_length:
            raise ValueError(f"KV cache of {length} positions exceeds the context of {self.max_length}")

    def crop(self, length: int) -> int:
        """Forget positions from `length` on; returns how many were dropped."""
        dropped = max(self.length - length, 0)
        self.length -= dropped
        return dropped

    def nbytes(self) -> int:
        return self._nbytes

    def own_bytes(self) -> int:
        """Memory that dropping this cache frees: none (the pool stays allocated; the slot goes back to it)."""
        return 0
