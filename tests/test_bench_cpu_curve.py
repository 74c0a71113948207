"""`specdec bench --cpu-curve` end to end on a tiny GGUF-sourced model, with llama-bench's JSON beside it."""

from __future__ import annotations

import json

from conftest import GGUF_TARGET

from specdec.cli.main import main


def test_cpu_curve_reports_each_path_against_its_floors(tmp_path):
    llama = tmp_path / "llama.json"  # the shape `llama-bench -p 1,2,5,9 -n 0 -o json` writes
    llama.write_text(json.dumps([{"n_prompt": s, "n_gen": 0, "avg_ts": 10.0 * s ** 0.5} for s in (1, 2, 5, 9)]
                                + [{"n_prompt": 0, "n_gen": 64, "avg_ts": 30.0}]))
    output = tmp_path / "curve.json"
    assert main(["bench", "--cpu-curve", "gguf-q8,gguf", "--target-model", GGUF_TARGET, "--device", "cpu",
                 "--llama-bench", str(llama), "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert [r["path"] for r in result["paths"]] == ["gguf-q8", "gguf"]
    q8, exact = result["paths"]
    assert q8["kernel"].startswith("gguf-q8-") and exact["kernel"] == "gguf-Q4_K+Q6_K"
    assert q8["weight_bytes"] < exact["weight_bytes"] * 1.05  # the same blocks, repacked
    assert all(r["forward_ms"][str(s)] > 0 for r in result["paths"] for s in (1, 2, 5, 9))
    floors = [result["floor_ms"][str(s)] for s in (1, 2, 5, 9)]
    assert floors == sorted(floors) and floors[0] >= result["bandwidth_floor_ms"] > 0
    assert result["dot_peak_GMACps"] > 0 and result["kernel_rate_GMACps"] > 0
    # S = 9's floor is at least its multiply-adds over the dot peak (both as written: rounded to 0.01 ms and 0.1 G/s)
    assert floors[-1] >= 9 * q8["macs_per_token"] / (result["dot_peak_GMACps"] * 1e9) * 1e3 * 0.99 - 0.005
    assert result["llama_cpp_ms"] == {"1": 100.0, "2": round(2000 / 2 ** 0.5 / 10, 2),
                                      "5": round(5000 / 5 ** 0.5 / 10, 2), "9": round(9000 / 3 / 10, 2)}
    assert (tmp_path / "curve.png").stat().st_size > 0
