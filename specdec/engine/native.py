"""Building and loading the C kernel of the "gguf" compute path (`specdec/engine/csrc/blockquant.c`).

The kernel is plain C with GCC's generic vectors, built once per x86 level with the system
compiler (about 2-5 s) into the cache, keyed by the source's hash, and loaded with ctypes: no
torch headers, so no minute-long extension build. Its OpenMP regions run on the libgomp that
torch already loaded (same soname), so the two share one thread pool instead of fighting over cores.

`scripts/setup.sh` builds the variant for this machine; a missing one is built on first use.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from specdec.weights import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "csrc" / "blockquant.c"
MARCH = {"sse41": "x86-64-v2", "avx2": "x86-64-v3"}  # every AVX-512 level (and AMX): x86-64-v4
FLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp", "-fPIC", "-shared", "-Wno-psabi")


class KernelUnavailable(RuntimeError):
    """The C kernel cannot be built or loaded here (no compiler, or not an x86 CPU)."""


def march_for(level: str | None) -> str:
    if level is None:
        raise KernelUnavailable("the gguf kernel needs an x86-64 CPU with SSE4.1 or later")
    return MARCH.get(level, "x86-64-v4")


def build_digest() -> str:
    """What a build of the kernel depends on here: its source and compiler flags (16 hex digits)."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]


def library_path(march: str) -> Path:
    return cache_root() / "kernels" / f"blockquant-{build_digest()}-{march}.so"


def build(march: str) -> Path:
    """Compile the kernel for `march` into the cache unless it is there; returns the library's path."""
    target = library_path(march)
    if target.exists():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc/gcc) to build the gguf kernel; install gcc or use --dtype float32")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            run = subprocess.run([compiler, *FLAGS, f"-march={march}", "-o", str(partial), str(SOURCE)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise KernelUnavailable(f"building the gguf kernel for {march} failed:\n{run.stderr[-2000:]}")
            partial.rename(target)
    log.info("built the gguf kernel for %s: %s", march, target)
    return target


@lru_cache(maxsize=None)
def load(march: str) -> ctypes.CDLL:
    """The kernel library for `march`, built if needed, with its functions' signatures declared."""
    import torch  # noqa: F401  (its libgomp must be loaded first, so the kernel shares it)

    lib = ctypes.CDLL(str(build(march)))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.bq_matmul.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, i64, ctypes.c_int]
    lib.bq_matmul.restype = ctypes.c_int
    lib.bq_dequantize_rows.argtypes = [ctypes.c_int, ptr, i64, ptr, i64, ptr]
    lib.bq_dequantize_rows.restype = ctypes.c_int
    for name in ("bq_block_bytes", "bq_block_weights"):
        getattr(lib, name).argtypes = [ctypes.c_int]
        getattr(lib, name).restype = i64
    return lib


def main() -> None:
    """`python -m specdec.engine.native`: build the kernel for this machine's level (scripts/setup.sh runs it)."""
    from specdec.engine.cpu import cpu_features

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(build(march_for(cpu_features().level)))
    except KernelUnavailable as error:
        print(f"warning: {error}; the gguf path falls back to float32")


if __name__ == "__main__":
    main()
