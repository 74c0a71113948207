"""`SPECDEC_CPU_ISA` read against CPUs described by their /proc/cpuinfo flags: which level, whether VNNI is usable,
what the kernels get and what is refused. tests/test_cpu_variants.py runs the caps this machine has for real."""

from __future__ import annotations

import pytest

from specdec.engine.cpu import features
from specdec.engine.cpu.features import ENV, UnsupportedIsa, cpu_features
from specdec.engine.cpu.native import q8_variants_for

# Each CPU: its top level (as torch's probes would find it) and whether it has the 256-bit AVX-VNNI.
CPUS = {"Sierra Forest": ("avx2", True), "Zen 3": ("avx2", False), "Sapphire Rapids": ("amx", True),
        "Zen 4": ("avx512_bf16", False), "Skylake-SP": ("avx512", False)}


@pytest.fixture
def cpu(monkeypatch):
    """Makes cpu_features() see the CPU named, capped at `cap` (None: no cap)."""
    def describe(name: str, cap: str | None):
        native, avx_vnni = CPUS[name]
        flags = "sse4_1 avx2" + (" avx_vnni" if avx_vnni else "")
        monkeypatch.setattr(features, "cpuinfo", lambda field: flags if field == "flags" else name)
        monkeypatch.setattr(features, "native_level", lambda _flags: native)
        if cap is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, cap)
        cpu_features.cache_clear()
        return cpu_features()
    yield describe
    cpu_features.cache_clear()


@pytest.mark.parametrize("name, cap, level, vnni, variants", [
    ("Sierra Forest", None, "avx2", True, ("avx-vnni",)),
    ("Sierra Forest", "avx2", "avx2", False, ("avx2",)),
    ("Sierra Forest", "avx2_vnni", "avx2", True, ("avx-vnni",)),
    ("Zen 3", None, "avx2", False, ("avx2",)),
    ("Sapphire Rapids", "avx2_vnni", "avx2", True, ("avx-vnni",)),
    ("Sapphire Rapids", "avx2", "avx2", False, ("avx2",)),
    ("Sapphire Rapids", "avx512", "avx512", False, ("avx512", "avx2")),
    ("Sapphire Rapids", "avx512_vnni", "avx512_vnni", True, ("avx512-vnni",)),
    ("Zen 4", "sse41", "sse41", False, ("sse4.1",)),
])
def test_a_cap_sets_the_level_vnni_and_the_kernels_builds(cpu, name, cap, level, vnni, variants):
    seen = cpu(name, cap)
    assert (seen.level, seen.vnni, q8_variants_for(seen)) == (level, vnni, variants)
    own = "avx2_vnni" if CPUS[name] == ("avx2", True) else CPUS[name][0]
    assert seen.forced == (cap is not None and cap != own)
    described = seen.describe()
    assert described.startswith(f"{name} [{level}{'+vnni' if vnni and 'avx512' not in level else ''}")
    assert ("forced by SPECDEC_CPU_ISA" in described) == seen.forced


def test_a_cap_at_the_cpus_own_level_is_no_cap(cpu):
    assert cpu("Zen 3", "avx2").describe() == "Zen 3 [avx2]"
    assert cpu("Sierra Forest", "avx2_vnni").describe() == "Sierra Forest [avx2+vnni]"
    seen = cpu("Sierra Forest", "avx2")
    assert seen.forced and not seen.vnni, "avx2 keeps AVX-VNNI away where the CPU's top level has it"
    assert seen.describe() == "Sierra Forest [avx2, forced by SPECDEC_CPU_ISA; native avx2+vnni]"


@pytest.mark.parametrize("name, cap, message", [
    ("Zen 4", "avx2_vnni", "has no AVX-VNNI"),
    ("Skylake-SP", "avx2_vnni", "has no AVX-VNNI"),
    ("Zen 3", "avx512", "tops out at avx2"),
    ("Zen 3", "avx2-vnni", "not a level; choose one of .*avx2_vnni"),
])
def test_a_cap_the_cpu_cannot_honour_is_refused(cpu, name, cap, message):
    with pytest.raises(UnsupportedIsa, match=message):
        cpu(name, cap)
