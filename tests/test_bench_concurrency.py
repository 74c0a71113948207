"""`specdec bench --concurrency` end to end on tiny models: one row per config and level, a JSON and a PNG, and
peer servers driven beside ours."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.main import main
from specdec.http.flags import HttpConfig
from specdec.http.server import start_http
from specdec.tools.bench.concurrency import level_prompts, parse_peers


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


def test_a_peer_server_runs_each_level_beside_ours_and_our_configs_are_put_over_it(tmp_path, stack, capsys):
    """The peer here is our own OpenAI API on another stack: any server of /v1/completions with usage chunks."""
    api = start_http(HttpConfig(endpoint=stack.endpoint), "127.0.0.1", 0)
    output = tmp_path / "conc.json"
    try:
        assert main(["bench", "--concurrency", "2", "--repeats", "2", "--no-hf", "--device", "cpu", "--draft-model",
                     TINY_DRAFT, "--target-model", TINY_TARGET, "--max-new-tokens", "10", "--limit-prompts", "2",
                     "--peers", f"peer={api.url}", "--output", str(output)]) == 0
    finally:
        api.stop()
    rows = {r["config"]: r for r in json.loads(output.read_text())["rows"]}
    assert list(rows) == ["target-only", "adaptive", "peer"]
    assert rows["peer"]["runs"] == 2 and min(rows["peer"]["run_tokens_per_s"]) > 0
    assert rows["peer"]["ttft_s"] > 0, "its users' first tokens were timed"
    assert rows["peer"]["itl_p50_ms"] is None, "an HTTP chunk's tokens are not counted, so no gap per token"
    printed = capsys.readouterr().out
    ratio = rows["adaptive"]["tokens_per_s"] / rows["peer"]["tokens_per_s"]
    assert "over peer: target-only@2 " in printed and f"adaptive@2 {ratio:.3f}x" in printed


class RefusingPeer(BaseHTTPRequestHandler):
    """Lists a model, and answers every completion as llama-server does a prompt over its slot's context."""

    def do_GET(self):
        self.answer(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.answer(400, {"error": {"code": 400, "message": "the request exceeds the available context size"}})

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_peer_that_refuses_fails_the_bench_with_its_answer(tmp_path):
    """A peer's HTTP error ends the run before our stack loads, with what it said; one that is not there too."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusingPeer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SystemExit, match="did not answer a completion: .*HTTP 400: .*exceeds the available"):
            main(["bench", "--concurrency", "2", "--no-hf", "--device", "cpu", "--draft-model", TINY_DRAFT,
                  "--target-model", TINY_TARGET, "--max-new-tokens", "4", "--limit-prompts", "1",
                  "--peers", f"refusing=http://127.0.0.1:{server.server_address[1]}",
                  "--output", str(tmp_path / "conc.json")])
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SystemExit, match="did not answer a completion: .*Connection refused"):
        main(["bench", "--concurrency", "2", "--no-hf", "--peers", f"gone=http://127.0.0.1:{server.server_address[1]}"])


@pytest.mark.parametrize("spec", ["llama", "=http://127.0.0.1:1", "llama=127.0.0.1:8091",
                                  "adaptive=http://127.0.0.1:1", "a=http://127.0.0.1:1,a=http://127.0.0.1:2"])
def test_a_peer_not_named_as_name_equals_url_or_by_a_taken_name_is_refused(spec):
    with pytest.raises(SystemExit, match="--peers"):
        parse_peers(spec)
    assert parse_peers("a=http://127.0.0.1:1/,b=http://h:2") == [("a", "http://127.0.0.1:1"), ("b", "http://h:2")]


def test_a_level_meets_every_prompt_over_its_repeats():
    base = ["a", "b", "c", "d"]
    assert [level_prompts(base, 1, r) for r in range(5)] == [["a"], ["b"], ["c"], ["d"], ["a"]]
    assert [level_prompts(base, 3, r) for r in range(2)] == [["a", "b", "c"], ["d", "a", "b"]]
    assert all(sorted(level_prompts(base, 8, r)) == sorted(base * 2) for r in range(3)), "more users: each as often"
