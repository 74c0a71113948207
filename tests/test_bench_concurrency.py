"""`specdec bench --concurrency` end to end on tiny models: one row per config and level, a JSON and a PNG."""

from __future__ import annotations

import json

from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.main import main


def test_concurrency_bench_writes_rows_and_a_plot(tmp_path):
    output = tmp_path / "conc.json"
    assert main(["bench", "--concurrency", "1,3", "--repeats", "2", "--no-hf", "--device", "cpu", "--draft-model",
                 TINY_DRAFT, "--target-model", TINY_TARGET, "--max-new-tokens", "12", "--limit-prompts", "2",
                 "--output", str(output)]) == 0
    rows = json.loads(output.read_text())["rows"]
    assert [(r["config"], r["users"]) for r in rows] == [("target-only", 1), ("adaptive", 1), ("target-only", 3),
                                                         ("adaptive", 3)]
    assert all(r["tokens_per_s"] > 0 and r["itl_p95_ms"] >= r["itl_p50_ms"] for r in rows)
    assert all(r["runs"] == 2 for r in rows), "each config ran twice at each level"
    # Each run's own tokens/s, in the order run; the row's pools them (tokens over seconds), so it lies between.
    assert all(len(r["run_tokens_per_s"]) == 2 and min(r["run_tokens_per_s"]) > 0 for r in rows)
    assert all(min(r["run_tokens_per_s"]) - 1e-3 <= r["tokens_per_s"] <= max(r["run_tokens_per_s"]) + 1e-3
               for r in rows)
    # A round's wall time holds the target's forward passes and its wait for them.
    assert all(r["round_ms"] > r["target_forward_ms"] + r["target_wait_ms"] and r["target_forward_ms"] > 0
               for r in rows)
    assert output.with_suffix(".png").stat().st_size > 0
