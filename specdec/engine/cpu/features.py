"""What this CPU offers, and a way to make every compute library act as if it offered less.

Instruction-set levels, each including the ones before it:

    sse41 < avx2 < avx512 < avx512_vnni < avx512_bf16 < amx

and beside them `avx2_vnni`: AVX2 with the 256-bit AVX-VNNI (Intel's E-core Xeons and client cores), which
some AVX-512 CPUs have and others lack, so it is a cap of its own rather than a rung.

`SPECDEC_CPU_ISA=<level>` caps this process (and the services it starts, which inherit the
environment) at that level: `cpu_features()` reports the capped features, the kernels choose for
them, and oneDNN, ATen's vectorized kernels and MKL are capped through their own environment
variables (`ONEDNN_MAX_CPU_ISA`, `ATEN_CPU_CAPABILITY`, `MKL_ENABLE_INSTRUCTIONS`). Those libraries
read them once, at their first call, so the cap must be in the environment before the first
tensor op: importing this module sets them, and `isa_environment` gives them to a child process.
That is how a machine with the fast instructions tests the kernels of one without them.
Asking for a level this CPU lacks is an error, never a silent pass.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "SPECDEC_CPU_ISA"
LEVELS = ("sse41", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx")
AVX2_VNNI = "avx2_vnni"  # the level avx2 with AVX-VNNI kept: a cap only where the CPU has the `avx_vnni` flag
CAPS = (*LEVELS, AVX2_VNNI)
_ONEDNN = {"sse41": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE", "avx512_vnni": "AVX512_CORE_VNNI",
           "avx512_bf16": "AVX512_CORE_BF16", "amx": "AVX512_CORE_AMX", AVX2_VNNI: "AVX2_VNNI"}
_ATEN = {"sse41": "default", "avx2": "avx2", AVX2_VNNI: "avx2"}  # every AVX-512 level: "avx512"
_MKL = {"sse41": "SSE4_2", "avx2": "AVX2", AVX2_VNNI: "AVX2"}  # every AVX-512 level: "AVX512"
# MKL's strict reproducibility mode. Besides what MKL promises for it (the same bits whatever the thread count),
# measured on an Emerald Rapids Xeon: without it MKL's AVX2 sgemm gives a row of a product other bits when
# the product has another number of rows (the torch attention's q·kᵀ and p·v, and a dense fp32 linear), with
# it the same bits; its AVX-512 sgemm kept them either way, and on AMD CPUs so did every level. MKL has no
# strict mode below AVX2 (there `attention.fixed_order_matmul` takes over).
MKL_REPRODUCIBLE = {"MKL_CBWR": "AUTO,STRICT"}


class UnsupportedIsa(ValueError):
    """A forced instruction-set level that is unknown or that this CPU does not have."""


def isa_environment(level: str) -> dict[str, str]:
    """The environment variables that cap this project and its libraries at `level` (one of CAPS)."""
    if level not in CAPS:
        raise UnsupportedIsa(f"{ENV}={level!r} is not a level; choose one of {', '.join(CAPS)}")
    return {ENV: level, "ONEDNN_MAX_CPU_ISA": _ONEDNN[level], "ATEN_CPU_CAPABILITY": _ATEN.get(level, "avx512"),
            "MKL_ENABLE_INSTRUCTIONS": _MKL.get(level, "AVX512"), **MKL_REPRODUCIBLE}


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction-set level the kernels may use (`level`), and the machine's own (`native`)."""

    model_name: str
    level: str | None  # None: not x86, or older than SSE4.1
    native: str | None
    avx_vnni: bool = False  # the 256-bit VNNI of AVX2-class CPUs, usable: present, and not capped away
    cap: str | None = None  # $SPECDEC_CPU_ISA (one of CAPS) where it takes something away, else None
    native_avx_vnni: bool = False  # whether the CPU itself has AVX-VNNI

    def has(self, level: str) -> bool:
        return self.level is not None and LEVELS.index(self.level) >= LEVELS.index(level)

    @property
    def forced(self) -> bool:
        return self.cap is not None

    @property
    def avx512(self) -> bool:
        return self.has("avx512")

    @property
    def vnni(self) -> bool:
        """Exact u8·s8 dot products accumulating in int32 (without it, pairs saturate in int16)."""
        return self.has("avx512_vnni") or self.avx_vnni

    @property
    def native_bf16(self) -> bool:
        return self.has("avx512_bf16")

    @property
    def amx(self) -> bool:
        return self.has("amx")

    def describe(self) -> str:
        extra = ["vnni"] if self.vnni and not self.has("avx512_vnni") else []
        level = "+".join([self.level or "no sse4.1/avx", *extra])
        native = f"{self.native}+vnni" if self.native == "avx2" and self.native_avx_vnni else self.native
        return f"{self.model_name} [{level}" + (f", forced by {ENV}; native {native}]" if self.forced else "]")


def cpuinfo(field: str) -> str:
    """The first `field` line's value in /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def native_level(flags: set[str]) -> str | None:
    """The highest level this CPU has, as torch's CPU probes (and /proc/cpuinfo `flags`) see it."""
    cpu = torch.cpu
    checks = {"sse41": "sse4_1" in flags or cpu._is_avx2_supported(), "avx2": cpu._is_avx2_supported(),
              "avx512": cpu._is_avx512_supported(), "avx512_vnni": cpu._is_vnni_supported(),
              "avx512_bf16": cpu._is_avx512_bf16_supported(), "amx": cpu._is_amx_tile_supported()}
    level = None
    for name in LEVELS:
        if not checks[name]:
            break
        level = name
    return level


@functools.cache
def cpu_features() -> CpuFeatures:
    """This CPU, capped at `$SPECDEC_CPU_ISA` when set (read once per process)."""
    flags, name = set(cpuinfo("flags").split()), cpuinfo("model name") or "unknown CPU"
    native = native_level(flags)
    avx_vnni = "avx_vnni" in flags
    own = AVX2_VNNI if native == "avx2" and avx_vnni else native  # the cap that takes nothing away
    forced = os.environ.get(ENV, "").strip()
    if not forced or forced in ("native", own):
        return CpuFeatures(name, native, native, avx_vnni=avx_vnni, native_avx_vnni=avx_vnni)
    isa_environment(forced)  # validates the name
    level = "avx2" if forced == AVX2_VNNI else forced
    if native is None or LEVELS.index(level) > LEVELS.index(native):
        raise UnsupportedIsa(f"{ENV}={forced}: this CPU ({name}) tops out at {native or 'no SSE4.1'}")
    if forced == AVX2_VNNI and not avx_vnni:
        raise UnsupportedIsa(f"{ENV}={forced}: this CPU ({name}) has no AVX-VNNI (the avx_vnni flag)")
    return CpuFeatures(name, level, native, avx_vnni=avx_vnni and forced == AVX2_VNNI, cap=forced,
                       native_avx_vnni=avx_vnni)



def _cap_libraries() -> None:
    """Put the libraries' own caps in this process's environment (before their first call), and MKL's
    strict reproducibility mode whether capped or not."""
    forced = os.environ.get(ENV, "").strip()
    for name, value in (isa_environment(forced) if forced in CAPS else MKL_REPRODUCIBLE).items():
        os.environ.setdefault(name, value)


def rows_need_fixed_order() -> bool:
    """Whether MKL's products may give a row other bits beside other rows here: below AVX2, where it has no
    strict mode."""
    features = cpu_features()
    return features.level is not None and not features.has("avx2")


_cap_libraries()
