"""Whether a load fits in the memory this machine can still give it. A load that does not fit is refused before it
starts, with what it needs and why; otherwise it would end in the kernel's OOM killer (SIGKILL: no message, and on
a server the process gone) or in swap."""

from __future__ import annotations

from pathlib import Path

import numpy as np

MEMINFO = Path("/proc/meminfo")
GIB = 2**30


class NotEnoughMemory(MemoryError):
    """A load needs more memory than this machine has available."""


def available_bytes() -> int | None:
    """What can still be had without the OOM killer: MemAvailable plus SwapFree (None where /proc/meminfo is not
    readable: another OS)."""
    try:
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
        return sum(int(fields[key].split()[0]) * 1024 for key in ("MemAvailable", "SwapFree"))
    except (OSError, KeyError, ValueError):
        return None


def safetensors_elements(folder: Path) -> int:
    """The elements of every tensor in the folder's .safetensors files (their headers only)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as tensors:
            for name in tensors.keys():
                shape = tensors.get_slice(name).get_shape()
                total += int(np.prod(shape)) if shape else 1
    return total


def check_fits(what: str, need: int, why: str = "") -> None:
    """Raise NotEnoughMemory if `what`, needing `need` bytes, needs more than is available; `why` (appended to the
    message) says where the bytes go."""
    available = available_bytes()
    if available is not None and need > available:
        raise NotEnoughMemory(f"{what} needs about {need / GIB:.1f} GiB{why} and this machine has "
                              f"{available / GIB:.1f} GiB available")
