"""`specdec bench --samplers` end to end on tiny models: both samplers measured, and every coupled output equal
to its target-only output."""

from __future__ import annotations

import json

from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.main import main


def test_samplers_bench_compares_both_and_checks_the_coupled_outputs(tmp_path):
    output = tmp_path / "samplers.json"
    assert main(["bench", "--samplers", "0.9", "--device", "cpu", "--draft-model", TINY_DRAFT, "--target-model",
                 TINY_TARGET, "--max-new-tokens", "24", "--limit-prompts", "2", "--repeats", "2", "--proposer",
                 "model", "--gammas", "2", "--output", str(output)]) == 0
    payload = json.loads(output.read_text())
    adaptive, fixed = payload["rows"]
    assert [adaptive["speculation"], fixed["speculation"]] == ["adaptive", "γ = 2"]
    for row in (adaptive, fixed):
        assert row["temperature"] == 0.9 and row["outputs"] == 4 and row["coupled_equal_target_only"] == 4
    for sampler in ("coupled", "rejection"):  # the tiny pair's adaptive policy may not draft; γ = 2 does
        assert fixed[sampler]["tokens_per_s"] > 0 and 0 < fixed[sampler]["accepted"] <= fixed[sampler]["drafted"]
    (position,) = payload["per_position"]  # coupling near the rejection sampler's 1 - TV, above its own bound
    assert position["positions"] > 20
    assert position["coupling_bound"] - 0.05 <= position["coupled_agreement"] <= position["one_minus_tv"] + 0.05
