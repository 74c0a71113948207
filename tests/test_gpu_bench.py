"""`specdec bench --gpu`, the GPU benchmark in one command, dry-run on the CPU (`--device cpu`) on a small
synthetic pair: every part runs and lands in its JSON, so that whoever next holds a GPU can run it as written."""

from __future__ import annotations

import json

from specdec.cli.main import main
from specdec.tools.bench.gpu import first_difference

PAIR = ["--draft-model", "synthetic:draft,shape=small,eps=0.1",
        "--target-model", "synthetic:target,shape=small,eps=0.1"]


def test_the_gpu_benchmark_runs_every_part_and_writes_it(tmp_path):
    out = tmp_path / "gpu.json"
    assert main(["bench", "--gpu", "--device", "cpu", "--dtype", "bfloat16", *PAIR, "--max-new-tokens", "8",
                 "--limit-prompts", "1", "--gammas", "2", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    curves = result["step_curves"]
    for role in ("target", "draft"):
        assert "static_compiled_error" not in curves[role], curves[role]
        assert len(curves[role]["static_ms"]) == len(curves[role]["static_compiled_ms"]) == len(curves["sizes"])
        assert curves[role]["floor_ms"] > 0
    assert 0.0 <= result["greedy_agreement"] <= 1.0
    assert [row["config"] for row in result["rows"]] == ["target-only", "γ=2", "adaptive", "ngram", "hybrid"]
    assert all(row["identical_to_target_only"] for row in result["rows"]), "speculation changed the greedy output"
    assert set(result["eight_users"]) == {"target-only", "adaptive"}
    assert all(1 <= row["target_rows_per_pass"] <= 8 for row in result["eight_user_rows"])
    assert set(result["hf"]) == set(result["hf_first_difference"]) == {"hf-eager", "hf-static-compiled"}
    assert all(len(departures) == 1 for departures in result["hf_first_difference"].values())
    assert result["hf_static_not_compiled"]  # generate compiles its step on CUDA only
    assert list(result["part_seconds"]) == ["step curves", "one user", "8 users", "hf-eager", "hf-static-compiled"]


def test_the_services_part_alone_runs_one_user_and_eight(tmp_path):
    out = tmp_path / "gpu.json"
    assert main(["bench", "--gpu", "--gpu-services", "--device", "cpu", "--dtype", "bfloat16", *PAIR,
                 "--max-new-tokens", "8", "--limit-prompts", "1", "--gammas", "", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert "step_curves" not in result and "greedy_agreement" not in result and "hf" not in result
    assert [row["config"] for row in result["rows"]] == ["target-only", "adaptive", "ngram", "hybrid"]
    assert not result["services_compiled"]  # on CUDA the services' default: compiled
    assert list(result["part_seconds"]) == ["one user", "8 users"]


def test_the_services_part_with_the_compiled_reference_after_it(tmp_path):
    out = tmp_path / "gpu.json"
    assert main(["bench", "--gpu", "--gpu-services", "--gpu-hf", "--device", "cpu", "--dtype", "bfloat16", *PAIR,
                 "--max-new-tokens", "8", "--limit-prompts", "1", "--gammas", "", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert "step_curves" not in result and set(result["hf"]) == {"hf-static-compiled"}
    assert list(result["part_seconds"]) == ["one user", "8 users", "hf-static-compiled"]


def test_first_difference_is_the_first_token_that_differs():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([], [4]) == 0


def test_without_a_gpu_it_says_so_and_how_to_dry_run_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert main(["bench", "--gpu", *PAIR, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs CUDA" in err and "--device cpu" in err, err
    assert not out.exists()
