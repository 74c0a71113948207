"""The compute-path tests once per CPU instruction-set level, each level in a process of its own.

`SPECDEC_CPU_ISA` (`specdec.engine.cpu.features`) caps our kernel choice and oneDNN, ATen and MKL at a level, so a
machine with AVX-512 and VNNI also runs the kernels a Zen 3 or an older Xeon gets, and one with AVX-VNNI those of an
E-core Xeon (`avx2_vnni`). A level this machine lacks is skipped, with the reason; the machine's own level is the in-process run of
tests/test_compute_paths.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.engine.cpu.features import AVX2_VNNI, CAPS, LEVELS, cpu_features, isa_environment

ROOT = Path(__file__).resolve().parent.parent
# What oneDNN's verbose mode prints after "isa:" at each level (its own names), to prove the cap took.
ONEDNN_ISA = {"sse41": "Intel SSE4.1", "avx2": "Intel AVX2",
              "avx512": "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions",
              "avx512_vnni": "Intel AVX-512 with Intel DL Boost",
              "avx512_bf16": "Intel AVX-512 with Intel DL Boost and bfloat16 support",
              "amx": "Intel AVX-512 with Intel DL Boost and bfloat16 support and Intel AMX",
              AVX2_VNNI: "Intel AVX2 with Intel DL Boost"}
PROBE = """
import torch
from specdec.engine.cpu.features import cpu_features
from specdec.engine.kernels import make_kernel
make_kernel("fp32", torch.randn(8, 8), None, "onednn")(torch.randn(2, 8))
print("level", cpu_features().level, "vnni", cpu_features().vnni, "aten", torch.backends.cpu.get_cpu_capability())
"""


def _capped(level: str) -> dict[str, str]:
    return {**os.environ, **isa_environment(level)}


def _skip_unless_runnable(level: str) -> None:
    features = cpu_features()
    if level == AVX2_VNNI and not features.native_avx_vnni:
        pytest.skip(f"{features.model_name} lacks AVX-VNNI")
    if not features.has("avx2" if level == AVX2_VNNI else level):
        pytest.skip(f"{features.model_name} lacks {level}: it tops out at {features.level}")


@pytest.mark.parametrize("level", CAPS)
def test_the_cap_reaches_every_library(level):
    _skip_unless_runnable(level)
    probe = subprocess.run([sys.executable, "-c", PROBE], env={**_capped(level), "ONEDNN_VERBOSE": "1"}, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    isa = next(line for line in probe.stdout.splitlines() if ",isa:" in line).split(",isa:", 1)[1]
    # At the top level oneDNN names AMX by what else the CPU has: "... bfloat16 support and Intel AMX with
    # bfloat16 and 8-bit integer support" on a Sapphire Rapids, "Intel AVX10.1 and Intel AMX with ..." on an
    # Emerald Rapids (family 6 model 207, whose AVX512-FP16 oneDNN counts as AVX10.1).
    assert isa == ONEDNN_ISA[level] or (level == "amx" and "Intel AMX" in isa), isa
    ours = next(line for line in probe.stdout.splitlines() if line.startswith("level "))
    aten = isa_environment(level)["ATEN_CPU_CAPABILITY"].upper()
    vnni = level == AVX2_VNNI or LEVELS.index(level) >= LEVELS.index("avx512_vnni")
    assert ours == f"level {'avx2' if level == AVX2_VNNI else level} vnni {vnni} aten {aten}", ours


@pytest.mark.parametrize("level", CAPS)
def test_compute_paths_at_level(level):
    _skip_unless_runnable(level)
    if level == cpu_features().level:
        pytest.skip(f"{level} is this machine's own level: tests/test_compute_paths.py runs it in-process")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_compute_paths.py"], env=_capped(level), cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"at {level}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"


def test_a_level_this_cpu_lacks_is_refused():
    top = cpu_features().native
    if top == LEVELS[-1]:
        pytest.skip(f"this CPU has every level up to {top}")
    above = LEVELS[LEVELS.index(top) + 1] if top else LEVELS[0]
    code = "from specdec.engine.cpu.features import cpu_features; cpu_features()"
    probe = subprocess.run([sys.executable, "-c", code],
                           env={**os.environ, "SPECDEC_CPU_ISA": above}, cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode != 0 and f"SPECDEC_CPU_ISA={above}: this CPU" in probe.stderr, probe.stderr[-2000:]
