"""Serving processes freeze what start-up built out of the garbage collector's walks (`specdec.runtime.heap`):
the helper itself, an embedded stack's own process, and a service process through its start-up log; a frozen
process's exit frees what it froze; `exit_now` ends a process without that teardown."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from conftest import TINY_DRAFT
from specdec.runtime.heap import freeze_startup_heap

ROOT = Path(__file__).resolve().parents[1]


def _walked(obj) -> bool:
    """Whether a collection walks `obj` (it is in generations 0-2, not the frozen one)."""
    return any(o is obj for o in gc.get_objects())


class Node:
    def __init__(self):
        self.other = self


def test_freezing_collects_start_ups_garbage_and_takes_the_rest_out_of_the_walk():
    kept = [[i] for i in range(1000)]  # tracked containers, still referenced
    cycle = Node()  # unreachable once dropped, but only a collection frees a cycle
    dead = weakref.ref(cycle)
    del cycle
    frozen = freeze_startup_heap()
    assert dead() is None, "start-up's unreachable cycles are collected before the freeze"
    assert frozen > 0
    assert not _walked(kept) and not _walked(kept[0])
    later = [0]
    assert _walked(later), "what the process builds afterwards is collected as usual"


def test_an_embedded_stack_serves_with_its_start_up_frozen(stack):
    """The orchestrator of the embedded stack lives in this process: its server is frozen once started."""
    assert gc.get_freeze_count() > 0
    assert not _walked(stack.orchestrator) and not _walked(stack.orchestrator.servicer)


def test_a_service_process_freezes_its_start_up_before_serving():
    proc = subprocess.Popen([sys.executable, "-m", "draft_service", "--model", TINY_DRAFT, "--device", "cpu",
                             "--port", "0", "--log-level", "info", "--grammar-warmup", "off"],
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        match = None
        for line in proc.stderr:  # its log, until the serving line or its exit
            if (match := re.search(r"serving on port \d+ \((\d+) start-up objects", line)):
                break
        assert match, f"draft_service did not log its frozen start-up (exit {proc.poll()})"
        assert int(match.group(1)) > 10_000, "a process that imported torch and grpc holds far more"
    finally:
        proc.terminate()
        proc.wait(30)


# A process that has imported Triton's native module through torch._dynamo (as transformers does), frozen.
FROZEN_WITH_TRITON = "import torch._dynamo, triton._C.libtriton, gc; {freeze}"


def _exit_stderr(freeze: str) -> str:
    return subprocess.run([sys.executable, "-c", FROZEN_WITH_TRITON.format(freeze=freeze)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300).stderr


def test_a_frozen_process_frees_what_it_froze_at_exit():
    """Left frozen, the objects escape the interpreter's last collections, and Triton's native module (nanobind)
    reports its types and functions as leaked; `freeze_startup_heap` gives them back to the collector at exit."""
    pytest.importorskip("triton")
    assert "nanobind: leaked" in _exit_stderr("gc.collect(); gc.freeze()"), "the bare freeze leaks (the control)"
    assert "leaked" not in _exit_stderr("from specdec.runtime.heap import freeze_startup_heap; freeze_startup_heap()")


EXIT_NOW = """
import atexit, sys
from specdec.runtime.server import exit_now
class Finalized:
    def __del__(self):
        print("finalized", flush=True)
kept = Finalized()  # a module global: the interpreter's teardown would delete it
atexit.register(print, "exit handler")
sys.stdout.write("result, unflushed ")
exit_now(3, exit_handlers={handlers})
"""


@pytest.mark.parametrize("handlers", [True, False])
def test_exit_now_flushes_and_runs_exit_handlers_without_the_teardown(handlers):
    """`exit_now` (every service's and `specdec`'s end): the code and the buffered output come out, atexit's
    handlers run where asked, and the interpreter's finalization (about a second of CPU) does not."""
    run = subprocess.run([sys.executable, "-c", EXIT_NOW.format(handlers=handlers)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 3, run.stderr[-2000:]
    assert run.stdout == "result, unflushed " + ("exit handler\n" if handlers else "")
