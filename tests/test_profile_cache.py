"""The cost-profile cache: a one-shot command reuses what an earlier start measured, and any change
to the model, path, hardware or sizes measures again."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GGUF_DRAFT, GGUF_TARGET, TINY_DRAFT, TINY_TARGET

from specdec.engine.compute import PathChoice
from specdec.engine.profile_cache import (BUSY_MAX_AGE_S, BUSY_SHARE, ProfileCache, load_or_measure, profile_key,
                                         setting_key, setting_or_time, weights_fingerprint)
from specdec.planning.cost import CostProfile
from specdec.runtime.model_service_config import ModelServiceConfig

ROOT = Path(__file__).resolve().parent.parent


def _key(**changes) -> dict:
    fields = dict(spec="tiny:seed=0", path="fp32", kernel="onednn", device="cpu: X [avx2]", sizes=[1, 2, 3])
    return profile_key(**{**fields, **changes})


def test_a_stored_profile_comes_back_only_for_its_own_key(tmp_path):
    cache = ProfileCache(tmp_path)
    profile = CostProfile((0.01, 0.012, 0.02), (1, 2, 4), per_position_s=3e-8)  # attention at depth kept too
    assert cache.load(_key()) is None
    cache.store(_key(), profile)
    assert cache.load(_key()) == profile
    for change in ({"spec": "tiny:seed=1"}, {"path": "int8"}, {"kernel": "dense"},
                   {"device": "cpu: X [avx2, forced by SPECDEC_CPU_ISA; native avx512]"}, {"sizes": [1, 2]},
                   {"scored_tokens": 200}):
        assert cache.load(_key(**change)) is None, change


@pytest.mark.parametrize("path", ["gguf", "gguf-q8"])
def test_a_changed_gguf_kernel_measures_again(tmp_path, monkeypatch, path):
    from specdec.engine.cpu import native

    cache = ProfileCache(tmp_path)
    cache.store(_key(path=path, kernel="gguf-Q4_K+Q6_K"), CostProfile((0.01,)))
    assert cache.load(_key(path=path, kernel="gguf-Q4_K+Q6_K")) is not None
    built = native.build_digest

    def rebuilt(source=native.BLOCKQUANT):  # only this path's kernel changed
        return "another-build" if source is {"gguf": native.BLOCKQUANT, "gguf-q8": native.Q8DOT}[path] else built(source)

    monkeypatch.setattr(native, "build_digest", rebuilt)
    assert cache.load(_key(path=path, kernel="gguf-Q4_K+Q6_K")) is None


def test_expired_or_damaged_entries_are_measured_again(tmp_path):
    cache = ProfileCache(tmp_path, max_age_s=60)
    cache.store(_key(), CostProfile((0.01,)))
    (entry,) = tmp_path.glob("*.json")
    data = json.loads(entry.read_text())
    data["measured_at"] = time.time() - 61
    entry.write_text(json.dumps(data))
    assert cache.load(_key()) is None
    entry.write_text("{not json")
    assert cache.load(_key()) is None


def _age(entry: Path, seconds: float) -> None:
    data = json.loads(entry.read_text())
    data["measured_at"] -= seconds
    entry.write_text(json.dumps(data))


def test_a_profile_measured_on_a_busy_machine_is_kept_minutes_not_a_week(tmp_path):
    cache, profile = ProfileCache(tmp_path), CostProfile((0.01,))
    cache.store(_key(), profile, others_share=BUSY_SHARE + 0.3)
    cache.store(_key(spec="tiny:seed=1"), profile, others_share=BUSY_SHARE - 0.1)
    for entry in tmp_path.glob("*.json"):
        _age(entry, BUSY_MAX_AGE_S - 60)
    assert cache.load(_key()) == profile
    for entry in tmp_path.glob("*.json"):
        _age(entry, 120)
    assert cache.load(_key()) is None, "a busy machine's profile outlived its minutes"
    assert cache.load(_key(spec="tiny:seed=1")) == profile


def test_a_profile_measured_beside_busy_processes_is_stored_as_busy(tmp_path):
    """One spinning process per CPU of the machine while the profile is measured (a sleep here): the entry says
    that others took most of the machine."""
    cpus = sum(1 for line in Path("/proc/stat").read_text().splitlines() if line[:3] == "cpu" and line[3].isdigit())
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.5)
        load_or_measure(ProfileCache(tmp_path), _key, lambda: time.sleep(2.0) or CostProfile((0.01,)))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    (entry,) = tmp_path.glob("*.json")
    assert json.loads(entry.read_text())["others_share"] > BUSY_SHARE + 0.25


def test_a_kernel_setting_is_timed_once_then_taken_from_the_cache(tmp_path):
    """A kernel setting (`setting_or_time`) is timed where none is kept for its key, and after that taken as kept
    (applied, not timed) until its key changes; it is kept apart from the profiles; without a cache it is timed
    every time."""
    cache, timed, applied = ProfileCache(tmp_path), [], []
    choice = PathChoice("gguf-q8", "gguf-q8-avx512-vnni-Q4_K+Q6_K", "cpu: X [avx512_vnni]", True)

    def setting(of: PathChoice, cache_in: ProfileCache | None = cache) -> bool:
        return setting_or_time(cache_in, lambda: setting_key("one_row_pairs", "tiny:seed=0", of),
                               lambda: timed.append(of.kernel) or True, lambda on: applied.append(on) or on, "pairs")

    assert setting(choice) is True and timed == [choice.kernel] and applied == []
    assert setting(choice) is True and timed == [choice.kernel] and applied == [True]
    other = PathChoice("gguf-q8", "gguf-q8-avx2-Q4_K+Q6_K", choice.device, True)
    assert setting(other) is True and timed == [choice.kernel, other.kernel]
    assert not list(tmp_path.glob("*.json")) and len(list((tmp_path / "settings").glob("*.json"))) == 2
    assert cache.load(setting_key("one_row_pairs", "tiny:seed=0", choice)) is None, "a setting is no profile"
    setting(choice, None)
    assert timed == [choice.kernel, other.kernel, choice.kernel]


def test_one_shot_generate_measures_once_then_reuses_its_profiles_and_settings(tmp_path):
    """`specdec generate` (the README's first command's shape): its first start measures a cost profile and times
    the one-row setting of each gguf-q8 service; a second start takes both from the cache (nothing timed or stored
    again), names the same kernels and prints the same text. Its stderr ends with the summary line, not with
    reports from an interpreter's finalization."""

    def kernels(run: subprocess.CompletedProcess) -> list[str]:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "leaked" not in run.stderr and run.stderr.rstrip().splitlines()[-1].startswith("["), run.stderr[-2000:]
        return [line.split("(kernel ")[1].split(")")[0] for line in run.stderr.splitlines()
                if line.startswith(("draft:", "target:"))]

    first_run = generate_cli(tmp_path, draft=GGUF_DRAFT, target=GGUF_TARGET)
    first = kernels(first_run)
    assert len(first) == 2 and all(kernel.startswith("gguf-q8-") for kernel in first), first
    stored = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.json")}
    assert len([p for p in stored if p.parent == tmp_path]) == 2, "one profile each for the draft and the target"
    assert len([p for p in stored if p.parent.name == "settings"]) == 2, "a setting each for the draft and target"
    second_run = generate_cli(tmp_path, draft=GGUF_DRAFT, target=GGUF_TARGET)
    assert kernels(second_run) == first and second_run.stdout == first_run.stdout
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.json")} == stored, "the second start timed again"


def test_a_measurement_shows_its_progress_and_a_cached_profile_none(tmp_path, monkeypatch, capsys):
    """A service's start (`measure_costs`, what both services and a tensor-parallel front call) that measures shows
    how far it is on stderr, off a terminal as lines that end at 100% of the passes' tokens; a start that finds the
    profile cached prints nothing; a measurement shorter than PROGRESS_AFTER_S prints nothing either."""
    from specdec.engine.model_engine import Engine
    from specdec.engine.models import load_model
    from specdec.runtime import model_service

    config = ModelServiceConfig(model=TINY_TARGET, profile_cache=str(tmp_path), profile_tokens=3)
    with Engine(load_model(TINY_TARGET, "cpu")) as engine:
        monkeypatch.setattr(model_service, "PROGRESS_AFTER_S", 1e9)
        model_service.measure_costs(engine, config)
        assert capsys.readouterr().err == "", "a measurement shorter than PROGRESS_AFTER_S"
        monkeypatch.setattr(model_service, "PROGRESS_AFTER_S", 0.0)
        model_service.measure_costs(engine, dataclasses.replace(config, profile_cache=str(tmp_path / "new")))
        lines = capsys.readouterr().err.splitlines()
        assert lines and all(line.startswith(f"{TINY_TARGET}: timing its passes, once on this machine: ")
                             for line in lines), lines
        total = lines[-1].split(" of ")[1].split()[0]
        assert f"100% ({total} of {total} tokens, " in lines[-1], lines[-1]
        model_service.measure_costs(engine, dataclasses.replace(config, profile_cache=str(tmp_path / "new")))
        assert capsys.readouterr().err == "", "a cached profile is not measured"
        assert engine.cost_profile is not None


def test_weight_files_are_part_of_the_key(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = weights_fingerprint(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"y" * 11)
    assert weights_fingerprint(str(tmp_path)) != before
    assert weights_fingerprint("tiny:seed=0") == ["tiny:seed=0"]


def generate_cli(cache: Path, *extra: str, draft: str = TINY_DRAFT, target: str = TINY_TARGET
                 ) -> subprocess.CompletedProcess:
    """`specdec generate` of 4 tokens on these models, as a fresh process keeping cost profiles in `cache`."""
    return subprocess.run([sys.executable, "-m", "specdec.cli.main", "generate", "--device", "cpu", "--draft-model", draft,
                           "--target-model", target, "--prompt", "hello", "--max-new-tokens", "4", *extra],
                          env={**os.environ, "SPECDEC_PROFILE_CACHE": str(cache)}, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_the_cache_can_be_turned_off_or_moved(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    assert ModelServiceConfig("tiny:seed=0", profile_cache="off").cost_profile_cache() is None
    assert ModelServiceConfig("tiny:seed=0").cost_profile_cache().folder == tmp_path / "profiles"
    assert ModelServiceConfig("tiny:seed=0", profile_cache="/x").cost_profile_cache().folder == Path("/x")


def test_the_profile_reaches_the_orchestrator_with_its_attention_at_depth():
    """A service's Info carries its profile, attention at depth included (picoseconds a token and position), and
    the orchestrator reads back the profile the service plans with."""
    from specdec.engine.target_engine import TargetEngine
    from specdec.engine.models import load_model
    from specdec.runtime.wire import cost_profile_from_pb, model_info_to_pb

    with TargetEngine(load_model(TINY_TARGET, device="cpu")) as engine:
        engine.use_profile(CostProfile((0.022, 0.023, 0.024), (1, 2, 3), per_position_s=7.5e-7))
        info = model_info_to_pb(engine)
    assert info.forward_ps_per_position == 750_000
    assert cost_profile_from_pb(info) == engine.cost_profile
