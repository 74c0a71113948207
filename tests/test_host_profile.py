"""scripts/host_profile.py's summary of py-spy's raw stacks (the sampling itself needs py-spy and a stack)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "host_profile.py"


def load_script():
    spec = importlib.util.spec_from_file_location("host_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_own_time_is_the_innermost_line_and_ours_count_each_function_once_a_stack():
    raw = "\n".join([
        "run (threading.py:1) ;_round (target_service/servicer.py:22);verify (specdec/engine/model_engine.py:374);"
        "verify_greedy (specdec/core/rejection.py:34) 6",
        "run (threading.py:1) ;_round (target_service/servicer.py:22);_round (target_service/servicer.py:23);"
        "wait (threading.py:327) 3",
        "garbage line",
        "_work (specdec/engine/batcher.py:231) 1",
    ])
    summary = load_script().summarise(raw)
    lines = [line.strip() for line in summary.splitlines()]
    assert lines[0] == "10 samples with the GIL held"
    own = lines[lines.index("own time (innermost frame):") + 1:lines.index("ours, with what they call:") - 1]
    assert own == ["60.0%  verify_greedy (specdec/core/rejection.py:34)", "30.0%  wait (threading.py:327)",
                   "10.0%  _work (specdec/engine/batcher.py:231)"]
    ours = lines[lines.index("ours, with what they call:") + 1:]
    assert ours[0] == "90.0%  _round (target_service/servicer.py)", "a function on two lines of one stack, once"
    assert "60.0%  verify (specdec/engine/model_engine.py)" in ours
    assert not any("threading" in line for line in ours)
    assert load_script().summarise("") == "no samples (was the GIL ever held?)"
