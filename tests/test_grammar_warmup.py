"""A model service builds its grammars' tokenizer at start-up, before it serves: in its turn on the machine after a
measured profile, beside the next service's load after a cached one."""

import fcntl
from pathlib import Path

import pytest

from specdec.cli.main import build_parser
from specdec.cli.options import stack_options
from specdec.runtime.model_service import load_and_profile
from specdec.runtime.model_service_config import ModelServiceConfig

LOCK = "specdec-startup.lock"


class Grammars:
    def __init__(self, lock_path: Path):
        self.lock_path, self.warmed, self.lock_was_held = lock_path, False, None

    def warm(self) -> None:
        """Record the call, and whether the machine's start-up lock was held then (by the service starting)."""
        self.warmed = True
        with open(self.lock_path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                self.lock_was_held = False
            except BlockingIOError:
                self.lock_was_held = True


class Engine:
    def __init__(self, lock_path: Path, measures: bool = True):
        self.grammars, self.profiled, self.measures = Grammars(lock_path), False, measures

    def measure_costs(self, max_tokens: int, cache, progress=None) -> None:
        """A measurement tells `progress` how far it is; a profile from the cache does not."""
        assert not self.grammars.warmed, "the cost profile first, on a quiet machine"
        if self.measures:
            progress(1, 1)
        self.profiled = True


@pytest.fixture
def lock_path(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDEC_LOCK_DIR", str(tmp_path))
    return tmp_path / LOCK


def test_a_service_builds_its_grammars_after_its_profile_in_its_turn(lock_path):
    engine = load_and_profile(ModelServiceConfig(profile_cache="off"), lambda: Engine(lock_path))
    assert engine.profiled and engine.grammars.warmed and engine.grammars.lock_was_held


def test_after_a_cached_profile_the_grammars_are_built_beside_the_next_services_load(lock_path):
    engine = load_and_profile(ModelServiceConfig(), lambda: Engine(lock_path, measures=False))
    assert engine.profiled and engine.grammars.warmed and engine.grammars.lock_was_held is False


def test_no_warm_up_when_off(lock_path):
    engine = load_and_profile(ModelServiceConfig(profile_cache="off", grammar_warmup="off"), lambda: Engine(lock_path))
    assert engine.profiled and not engine.grammars.warmed


def test_serve_warms_and_one_shot_commands_do_not():
    """A service started on its own and `specdec serve`'s build the tokenizer at start-up (a server's first
    structured output waits for nothing); `specdec generate`'s and the benchmarks' do not (a one-shot's first
    token waits for nothing it does not use)."""
    args = build_parser().parse_args(["generate", "--prompt", "x"])
    assert stack_options(args).service.grammar_warmup == "off"
    assert stack_options(args, grammar_warmup="startup").service.grammar_warmup == "startup"
    assert ModelServiceConfig().grammar_warmup == "startup"
