"""`specdec bench --kernel-ab` end to end on a tiny GGUF-sourced model: two builds of the integer kernel swapped
into one loaded model (here this CPU's build twice, through two paths), and builds of another level refused
(each level repacks the weights in its own unit layout)."""

from __future__ import annotations

import json

import pytest
from conftest import GGUF_TARGET

from specdec import weights
from specdec.cli.main import main
from specdec.engine.cpu import native, q8dot
from specdec.engine.models import load_model
from specdec.planning.cost import PROFILE_CONTEXT
from specdec.tools.bench import kernel_ab


def test_kernel_ab_times_each_linear_and_pass_on_both_builds(tmp_path, monkeypatch):
    build = native.build(q8dot.machine_variant(), native.Q8DOT)
    copy = tmp_path / "copy.so"
    copy.write_bytes(build.read_bytes())
    builds = [build, copy]
    swapped, use = [], kernel_ab.Builds.use

    def recorded(self, which):
        swapped.append(which)
        use(self, which)

    monkeypatch.setattr(kernel_ab.Builds, "use", recorded)
    output = tmp_path / "ab.json"
    assert main(["bench", "--kernel-ab", ",".join(map(str, builds)), "--kernel-ab-repeats", "2",
                 "--kernel-ab-sizes", "1,2,6", "--kernel-ab-depths", "40,20", "--target-model", GGUF_TARGET,
                 "--device", "cpu", "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert (result["a"], result["b"]) == tuple(map(str, builds))
    names = ["qkv", "out", "gate_up", "down", "output", "pass"]
    assert [(r["name"], r["rows"], r.get("context")) for r in result["rows"]] == [
        *((n, s, PROFILE_CONTEXT if n == "pass" else None) for n in names for s in (1, 2, 6)),
        *(("pass", s, depth) for depth in (20, 40) for s in (1, 2, 6))]
    assert all(r["a_ms"] > 0 and r["b_ms"] > 0 and r["b_over_a"] > 0 for r in result["rows"])
    assert 0 in swapped and 1 in swapped  # both builds ran, and the baseline is left in place (last swap: 0)
    assert swapped[-1] == 0


def test_kernel_ab_needs_two_builds(tmp_path):
    with pytest.raises(SystemExit, match="two builds"):
        main(["bench", "--kernel-ab", "one.so", "--target-model", GGUF_TARGET, "--output", str(tmp_path / "x.json")])


def test_kernel_ab_sizes_must_be_row_counts(tmp_path):
    for sizes in ("0,2", "two", ""):
        with pytest.raises(SystemExit, match="kernel-ab-sizes"):
            main(["bench", "--kernel-ab", "a.so,b.so", "--kernel-ab-sizes", sizes, "--target-model", GGUF_TARGET,
                  "--output", str(tmp_path / "x.json")])


def test_kernel_ab_depths_must_be_context_lengths(tmp_path):
    with pytest.raises(SystemExit, match="kernel-ab-depths: positive context lengths"):
        main(["bench", "--kernel-ab", "a.so,b.so", "--kernel-ab-depths", "2048,-1", "--target-model", GGUF_TARGET,
              "--output", str(tmp_path / "x.json")])


def test_kernel_ab_fails_where_the_builds_logits_differ_at_depth(tmp_path):
    """Passes at depth are compared, not only timed: a build B whose pass moves one logit (as one that attends by
    another definition would) fails the run."""
    build = native.build(q8dot.machine_variant(), native.Q8DOT)
    copy = tmp_path / "copy.so"
    copy.write_bytes(build.read_bytes())
    loaded = load_model(weights.resolve(GGUF_TARGET), "cpu", dtype="gguf-q8")
    builds = kernel_ab.Builds(loaded.runner, [str(build), str(copy)])
    forward = loaded.runner.forward

    def b_moves_a_logit(steps):
        out = [logits.clone() for logits in forward(steps)]
        if builds.holders[0].lib is builds.libs[1]:
            out[0][..., 0] += 1.0
        return out

    assert kernel_ab.depth_rows(loaded, builds, (1, 2), (20,), 1)[0]["context"] == 20  # the same build: equal
    loaded.runner.forward = b_moves_a_logit
    with pytest.raises(AssertionError, match="logits differ at 1 rows after 20"):
        kernel_ab.depth_rows(loaded, builds, (1, 2), (20,), 1)


def test_kernel_ab_refuses_a_build_of_another_level(tmp_path):
    builds = [native.build(q8dot.machine_variant(), native.Q8DOT), native.build("portable", native.Q8DOT)]
    if q8dot.machine_variant() == "portable":
        pytest.skip("this machine's build is the portable one")
    with pytest.raises(SystemExit, match="builds of one level"):
        main(["bench", "--kernel-ab", ",".join(map(str, builds)), "--target-model", GGUF_TARGET, "--device", "cpu",
              "--output", str(tmp_path / "x.json")])
