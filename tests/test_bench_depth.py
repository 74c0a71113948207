"""`specdec bench --depths` end to end on a tiny GGUF-sourced model, with llama-bench's JSON beside it."""

from __future__ import annotations

import json

from conftest import GGUF_TARGET

from specdec.cli.main import main


def test_depths_report_decode_and_chunk_rates_beside_llama_cpp(tmp_path):
    llama = tmp_path / "llama.json"  # the shape `llama-bench -p 256 -n 16 -d 0,64 -o json` writes
    llama.write_text(json.dumps([{"n_prompt": 256, "n_gen": 0, "n_depth": d, "avg_ts": 100.0 - d} for d in (0, 64)]
                                + [{"n_prompt": 0, "n_gen": 16, "n_depth": d, "avg_ts": 30.0 - d / 8} for d in (0, 64)]))
    output = tmp_path / "depth.json"
    assert main(["bench", "--depths", "200,0,64", "--target-model", GGUF_TARGET, "--device", "cpu",
                 "--llama-bench", str(llama), "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["path"] == "gguf-q8" and result["kernel"].startswith("gguf-q8-")
    rows = result["rows"]
    assert [r["depth"] for r in rows] == [0, 64, 200]
    assert all(r["decode_tok_s"] > 0 and r["chunk_tok_s"] > 0 for r in rows)
    assert [(r.get("llama_decode_tok_s"), r.get("llama_chunk_tok_s")) for r in rows] == [
        (30.0, 100.0), (22.0, 36.0), (None, None)]
    assert (tmp_path / "depth.png").stat().st_size > 0


def test_each_timed_pass_ends_when_the_device_has_run_it(monkeypatch):
    """A GPU's forward returns before its kernels run: each timed pass starts on a drained queue (the fill's
    kernels are not its) and its clock stops after a synchronize."""
    from specdec.tools.bench import depth

    events: list[str] = []

    class Cache:
        length = 0

        def crop(self, length: int) -> None:
            self.length = length

    class Runner:
        device = "cuda:0"

        def new_cache(self):
            return Cache()

        def forward(self, steps):
            events.append("forward")
            steps[0].cache.length += len(steps[0].tokens)

    def clock():
        events.append("clock")
        return float(len(events))

    monkeypatch.setattr(depth, "synchronize", lambda device: events.append(f"sync {device}"))
    monkeypatch.setattr(depth.time, "perf_counter", clock)
    depth.measure_depths(Runner(), [0], vocab=32)
    assert events == ["sync cuda:0", "clock", "forward", "sync cuda:0", "clock"] * (depth.STEPS + depth.CHUNKS)
