"""Building and loading the C kernels of the gguf paths (`specdec/engine/cpu/csrc/`).

Two sources: `blockquant.c` (the exact "gguf" path) and `q8dot.c` (the integer "gguf-q8" path). Each is
plain C with GCC's generic vectors, built once per instruction-set variant with the system compiler
(blockquant about 10 s, q8dot about a minute) into the cache, keyed by the source's hash and flags (old builds
long unused are pruned: `prune`), and loaded with ctypes: no torch headers, so no minute-long extension build.
Their OpenMP regions run on the libgomp that torch already loaded (same soname), so the two share one thread pool
instead of fighting over cores.

`scripts/setup.sh` builds this machine's variants; a missing one is built on first use.
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
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from specdec.weights import cache_root

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
COMMON = ("-O3", "-fopenmp", "-fPIC", "-shared", "-Wno-psabi")


@dataclass(frozen=True)
class Source:
    """One kernel library: its C files (the first names it) and the flags every build of it gets."""

    name: str
    flags: tuple[str, ...]
    others: tuple[str, ...] = ("workers",)  # the library's other C files, beside `name`.c

    @property
    def paths(self) -> list[Path]:
        return [CSRC / f"{unit}.c" for unit in (self.name, *self.others)]


BLOCKQUANT = Source("blockquant", ("-ffp-contract=fast", *COMMON))
# The integer path's float steps, its layer's included, are defined without fused multiply-adds. Without GCC's
# jump threading: its backward pass took 66 of the 121 s that q8dot.c's AVX-512 VNNI build spent (GCC 12, `-ftime-
# report`; the kernels' one loop per format and row count), and without it the build takes 52 s, every pass of the
# 1.5B target and the 0.5B draft the same speed within 1% and the same bits (`specdec bench --kernel-ab`, VNNI and
# AVX2, 2026-12-07, Zen 4).
Q8DOT = Source("q8dot", ("-ffp-contract=off", "-fno-thread-jumps", *COMMON),
               ("q8pack", "layer_ops", "decoder", "workers"))

MARCH = {"sse41": "x86-64-v2", "avx2": "x86-64-v3"}  # every AVX-512 level (and AMX): x86-64-v4
# The fallback builds (CPUs without AVX2, and non-x86) without GCC's two global CSE passes: with them, GCC
# spent 60% of q8dot.c's build there (52 s for SSE4.1, 40 s portable; without, 19 s and 14 s) for a pass of the
# 1.5B target 0.2-2.8% faster at SSE4.1 (Granite Rapids class, `specdec bench --kernel-ab`). The tuned levels
# keep them: at AVX2 they made passes 0.1-1.2% faster, for 16-25 s a build.
FALLBACK = ("-fno-gcse", "-fno-gcse-after-reload")
# A new build removes the builds of its library and variant past the last KEEP_BUILDS used that no one has loaded
# for PRUNE_IDLE_S (`prune`).
KEEP_BUILDS, PRUNE_IDLE_S = 3, 7 * 24 * 3600.0
# The integer path's variants, fastest first, and what each is compiled with.
Q8_VARIANTS = {"avx512-vnni": ("-march=x86-64-v4", "-mavx512vnni"), "avx-vnni": ("-march=x86-64-v3", "-mavxvnni"),
               "avx512": ("-march=x86-64-v4",), "avx2": ("-march=x86-64-v3",),
               "sse4.1": ("-march=x86-64-v2", *FALLBACK), "portable": ("-DQ8_PORTABLE", *FALLBACK)}

# What each build needs of the CPU (/proc/cpuinfo flag names): q8dot's variants, and blockquant's -march levels.
X86_64_V4 = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
NEEDS = {"avx512-vnni": ("avx512_vnni", *X86_64_V4), "avx-vnni": ("avx_vnni", "avx2"), "avx512": X86_64_V4,
         "avx2": ("avx2",), "sse4.1": ("sse4_1",), "portable": (),
         "x86-64-v2": ("sse4_1",), "x86-64-v3": ("avx2",), "x86-64-v4": X86_64_V4}


class KernelUnavailable(RuntimeError):
    """The C kernel cannot be built or loaded here (no compiler, or not an x86 CPU)."""


def march_for(level: str | None) -> str:
    if level is None:
        raise KernelUnavailable("the gguf kernel needs an x86-64 CPU with SSE4.1 or later")
    return MARCH.get(level, "x86-64-v4")


def q8_variants_for(features) -> tuple[str, ...]:
    """The integer path's variants for `features` (`specdec.engine.cpu.features.CpuFeatures`): one, or two
    that the machine's own timing chooses between (`specdec.engine.cpu.q8dot.machine_variant`)."""
    if features.has("avx512_vnni"):
        return ("avx512-vnni",)
    if features.has("avx2") and features.vnni:
        return ("avx-vnni",)
    if features.has("avx512"):  # AVX-512BW without VNNI (Skylake-SP): AVX2's instructions on 64 bytes, whose
        return ("avx512", "avx2")  # 512-bit multiplies such a CPU may run on fewer ports and at a lower clock
    if features.has("avx2"):
        return ("avx2",)
    return ("sse4.1",) if features.has("sse41") else ("portable",)


def build_digest(source: Source = BLOCKQUANT, variant: str | None = None) -> str:
    """What a build of `source` depends on here: its files, the headers beside them and the compiler flags,
    `variant`'s too where given (16 hex digits)."""
    text = b"".join(p.read_bytes() for p in source.paths) + b"".join(h.read_bytes() for h in sorted(CSRC.glob("*.h")))
    flags = (*source.flags, *(_target_flags(variant, source) if variant else ()))
    return hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]


def library_name(source: Source, digest: str, variant: str) -> str:
    """The file name of `source`'s build for `variant` from files and flags of `digest` (a glob pattern where
    `digest` is one)."""
    return f"{source.name}-{digest}-{variant}.so"


def library_path(variant: str, source: Source = BLOCKQUANT) -> Path:
    return cache_root() / "kernels" / library_name(source, build_digest(source, variant), variant)


def _target_flags(variant: str, source: Source) -> tuple[str, ...]:
    return Q8_VARIANTS[variant] if source is Q8DOT else (f"-march={variant}",)


def build(variant: str, source: Source = BLOCKQUANT) -> Path:
    """Compile `source` for `variant` (a -march for blockquant, a Q8_VARIANTS key for q8dot) into the
    cache unless it is there; returns the library's path. A new build prunes the old ones (`prune`)."""
    target = library_path(variant, source)
    if target.exists():
        _used(target)
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc/gcc) to build the gguf kernel; install gcc or use --dtype float32")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:  # one build of it at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            command = [compiler, *source.flags, *_target_flags(variant, source), "-o", str(partial),
                       *map(str, source.paths)]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                raise KernelUnavailable(f"building the {source.name} kernel for {variant} failed:\n{run.stderr[-2000:]}")
            partial.rename(target)
    log.info("built the %s kernel for %s: %s", source.name, variant, target)
    prune(variant, source)
    return target


def _used(library: Path) -> None:
    """Mark a build as just used: its modification time is what `prune` keeps the recent ones by."""
    try:
        os.utime(library)
    except OSError:
        pass  # a read-only cache is never pruned either


def prune(variant: str, source: Source = BLOCKQUANT, keep: int = KEEP_BUILDS,
          idle_s: float = PRUNE_IDLE_S) -> list[Path]:
    """Remove the builds of `source` for `variant` other than the `keep` last used (every change of the C
    files or flags makes a new one: a checkout that moves along leaves a trail of libraries), where unused for
    `idle_s` too: another checkout or version may still load one. Returns the libraries removed."""
    folder = cache_root() / "kernels"
    used = {}
    for library in folder.glob(library_name(source, "?" * 16, variant)):
        try:
            used[library] = library.stat().st_mtime
        except FileNotFoundError:  # another process pruned it
            pass
    now = time.time()
    removed = [old for old in sorted(used, key=used.get, reverse=True)[keep:] if now - used[old] > idle_s]
    for old in removed:
        old.unlink(missing_ok=True)  # a process that loaded it keeps its mapping
        (folder / f".{old.name}.lock").unlink(missing_ok=True)
    if removed:
        log.info("removed %d old build(s) of the %s kernel for %s", len(removed), source.name, variant)
    return removed


def runnable(build_name: str) -> bool:
    """Whether this CPU runs the build `build_name` (a q8dot variant or a blockquant -march level)."""
    from specdec.engine.cpu.features import cpuinfo

    return set(NEEDS[build_name]) <= set(cpuinfo("flags").split())


def build_every_runnable(compilers: int = 2) -> None:
    """Build every library this CPU can run, `compilers` at once (the tests' forced levels load each; one at a
    time, inside the first test that needs it, they took about two minutes of a test run)."""
    from concurrent.futures import ThreadPoolExecutor

    from specdec.engine.cpu.features import LEVELS

    builds = [(m, BLOCKQUANT) for m in sorted({march_for(level) for level in LEVELS}) if runnable(m)]
    builds += [(v, Q8DOT) for v in Q8_VARIANTS if runnable(v)]
    with ThreadPoolExecutor(compilers) as pool:
        list(pool.map(lambda b: build(*b), builds))


@lru_cache(maxsize=None)
def load(variant: str, source: Source = BLOCKQUANT) -> ctypes.CDLL:
    """The kernel library for `variant`, built if needed, with its functions' signatures declared."""
    return open_library(build(variant, source), source)


def open_library(path: Path, source: Source = BLOCKQUANT) -> ctypes.CDLL:
    """The built library at `path` (one of `source`'s), with its functions' signatures declared."""
    import torch  # noqa: F401  (its libgomp must be loaded first, so the kernel shares it)

    lib = ctypes.CDLL(str(path))
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    signatures = {"bq_matmul": ([c_int, ptr, i64, i64, ptr, i64, ptr, i64, c_int], c_int),
                  "bq_dequantize_rows": ([c_int, ptr, i64, ptr, i64, ptr], c_int),
                  "bq_requantize_q4_0": ([c_int, ptr, i64, i64, ptr], c_int),
                  "bq_iq3_s_as_q6_k": ([ptr, i64, ptr, ptr], None),
                  "bq_block_bytes": ([c_int], i64), "bq_block_weights": ([c_int], i64)}
    if source is Q8DOT:
        signatures = {"q8_matmul": ([c_int, ptr, i64, i64, ptr, i64, ptr, i64, ptr, c_int], c_int),
                      "q8_repack": ([c_int, ptr, i64, i64, ptr], c_int), "q8_quantize": ([ptr, i64, i64, ptr], None),
                      "q8_row_bytes": ([c_int, i64], i64), "q8_act_bytes": ([i64], i64),
                      "q8_chunk_units": ([i64, i64], i64), "q8_set_one_row_pairs": ([c_int], c_int),
                      "q8_level": ([], ctypes.c_char_p),
                      "q8_dot_peak": ([c_int, i64], i64), "q8_unit_weights": ([], i64),
                      "lo_rms_norm": ([ptr, i64, i64, ptr, ctypes.c_float, ptr], None),
                      "lo_silu_mul": ([ptr, i64, i64, ptr], None),
                      "lo_attention": ([ptr, i64, i64, i64, i64, ptr, ptr, ctypes.c_float, ptr, ptr, ptr, ptr, i64, i64,
                                        ctypes.c_float, ptr, c_int], c_int),
                      "dec_layers": ([ptr, i64, ptr, i64, i64, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_float, ptr,
                                      c_int], c_int)}
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


def loadable(load: Callable[[], ctypes.CDLL]) -> bool:
    """Whether `load()` gets its kernel library here; why not is logged."""
    try:
        load()
        return True
    except KernelUnavailable as error:
        log.warning("%s", error)
        return False


def main() -> None:
    """`python -m specdec.engine.cpu.native`: build both kernels for this machine (scripts/setup.sh runs it)."""
    from specdec.engine.cpu.features import cpu_features

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(build(march_for(cpu_features().level)))
        for variant in q8_variants_for(cpu_features()):
            print(build(variant, Q8DOT))
    except KernelUnavailable as error:
        print(f"warning: {error}; the gguf paths fall back to float32")


if __name__ == "__main__":
    main()
