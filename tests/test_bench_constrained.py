"""`specdec bench --constrained` end to end on tiny models: four rows, answers checked against the schema,
speculation changing none of them, and the mask's cost."""

from __future__ import annotations

import json

from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.main import main
from specdec.tools.bench.constrained import follows_schema


def test_constrained_bench_checks_every_answer(tmp_path):
    output = tmp_path / "constrained.json"
    assert main(["bench", "--constrained", "--device", "cpu", "--draft-model", TINY_DRAFT, "--target-model",
                 TINY_TARGET, "--max-new-tokens", "90", "--limit-prompts", "2", "--proposer", "model",
                 "--output", str(output)]) == 0
    payload = json.loads(output.read_text())
    assert [r["config"] for r in payload["rows"]] == ["target-only", "adaptive", "target-only, JSON schema",
                                                      "adaptive, JSON schema"]
    assert [r["valid"] for r in payload["rows"][2:]] == [2, 2] and payload["identical"]
    assert all(follows_schema(text) for text in payload["outputs"]["adaptive, JSON schema"])
    assert 0 < payload["mask_ms_median"] <= payload["mask_ms_max"]
