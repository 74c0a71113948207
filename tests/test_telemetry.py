"""Tracing and metrics through the real processes: one trace per generation across all three
services, a real OTLP collector (rotel), Prometheus metrics, and the loop-latency profiler."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from conftest import TINY_DRAFT, TINY_TARGET, tiny_options
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack
from specdec.runtime.server import free_port
from specdec.tools.profiling.spans import (
    COMPONENTS,
    DIRECTIONS,
    SpanRecord,
    parse_otlp_request,
    read_otlp_json,
    round_breakdown,
    summarise_breakdown,
)

ROTEL = Path(__import__("rotel").__file__).parent / "rotel-agent"


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span in memory."""

    def __init__(self):
        self.spans: list[SpanRecord] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):
        with self._lock:
            self.spans.extend(parse_otlp_request(MessageToDict(request)))
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate, timeout: float = 30.0) -> list[SpanRecord]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.1)
        return spans


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """All three services as processes, exporting spans to an in-memory OTLP receiver."""
    receiver = OtlpReceiver()
    patch = pytest.MonkeyPatch()
    patch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export batches every 100 ms
    opts = tiny_options(service=dict(otlp_endpoint=f"127.0.0.1:{receiver.port}"), orchestrator_process=True,
                        metrics_port=free_port())
    with EmbeddedStack(opts) as stack:
        yield stack, receiver
    patch.undo()
    receiver.server.stop(0)


def test_one_generation_is_one_trace_across_all_three_services(traced):
    stack, receiver = traced
    result = generate(stack.endpoint, make_request(prompt="trace me", max_new_tokens=24, gamma=3, proposer="model",
                                                   overlap="off"))
    n_rounds = len(result.rounds)

    def complete(spans):
        return (sum(s.name == "round" for s in spans) >= n_rounds and any(s.name == "generate" for s in spans)
                and sum(s.name == "target.compute" for s in spans) >= n_rounds)

    spans = receiver.wait_for(complete)
    generate_span = next(s for s in spans if s.name == "generate")
    trace_spans = [s for s in spans if s.trace_id == generate_span.trace_id]
    by_id = {s.span_id: s for s in trace_spans}
    assert {s.service for s in trace_spans} == {"specdec-orchestrator", "specdec-draft", "specdec-target"}

    rounds = [s for s in trace_spans if s.name == "round"]
    assert len(rounds) == n_rounds and all(r.parent_id == generate_span.span_id for r in rounds)
    expected_parent = {"draft.propose": "round", "target.verify": "round", "draft.compute": "draft.propose",
                       "target.compute": "target.verify", "kv.rollback": ("draft.compute", "target.compute")}
    for span in trace_spans:
        if span.name in expected_parent:
            parent = by_id[span.parent_id].name
            allowed = expected_parent[span.name]
            assert parent in (allowed if isinstance(allowed, tuple) else (allowed,)), (span.name, parent)
    assert sum(s.name == "target.compute" for s in trace_spans) == n_rounds
    assert sum(s.name == "kv.rollback" for s in trace_spans) == sum(
        s.name in ("draft.compute", "target.compute") for s in trace_spans)

    for span, stats in zip(sorted(rounds, key=lambda s: s.start_ns), result.rounds):
        a = span.attributes
        assert (a["specdec.gamma"], a["specdec.drafted"], a["specdec.accepted"]) == \
               (stats.gamma, stats.drafted, stats.accepted)
        assert a["specdec.alpha_estimate"] == pytest.approx(stats.alpha_estimate, rel=1e-6)
        assert a["specdec.proposer"] == ("model" if stats.drafted else "") and a["specdec.probe"] is False
        assert a["specdec.target.bytes_sent"] > 0 and a["specdec.target.bytes_received"] > 0
        if stats.drafted:
            assert a["specdec.draft.bytes_received"] > 0
    # Spans nest in time: a service's compute lies inside the orchestrator's call to it.
    for span in trace_spans:
        if span.name in ("draft.compute", "target.compute"):
            call = by_id[span.parent_id]
            assert call.start_ns <= span.start_ns and span.end_ns <= call.end_ns + 2_000_000  # clock jitter


def test_a_branch_drafted_during_a_verify_is_traced_from_send_to_reply(traced):
    """Overlap: each branch is a "draft.prefetch" client span of the round that sent it, lasting until
    the next round collected its reply; the draft's compute span lies inside it."""
    stack, receiver = traced
    result = generate(stack.endpoint, make_request(prompt="trace my branches", max_new_tokens=24, gamma=3,
                                                   proposer="model", overlap="on"))
    branches = sum(r.overlapped for r in result.rounds)
    spans = receiver.wait_for(lambda spans: sum(s.name == "draft.prefetch" for s in spans) >= branches)
    by_id = {s.span_id: s for s in spans}
    prefetches = [s for s in spans if s.name == "draft.prefetch"]
    assert branches > 0 and len(prefetches) >= branches
    assert all(by_id[s.parent_id].name == "round" for s in prefetches)
    computes = [s for s in spans if s.name == "draft.compute" and by_id.get(s.parent_id) in prefetches]
    assert computes and all(by_id[s.parent_id].start_ns <= s.start_ns and s.end_ns <= by_id[s.parent_id].end_ns
                            + 2_000_000 for s in computes)


def test_prometheus_endpoint_counts_drafts_and_accepted_tokens(traced):
    stack, _ = traced
    result = generate(stack.endpoint, make_request(prompt="count me", max_new_tokens=32, gamma=2))
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.opts.metrics_port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)

    def metric(prefix: str) -> float:
        return sum(v for k, v in values.items() if k.split("{")[0] == prefix)

    # The metrics are cumulative over the module's generations: at least this one's counts.
    assert metric("spec_decode_num_drafts_total") >= sum(r.drafted > 0 for r in result.rounds) > 0
    assert metric("spec_decode_num_draft_tokens_total") >= sum(r.drafted for r in result.rounds)
    accepted = metric("spec_decode_num_accepted_tokens_total")
    assert accepted >= sum(r.accepted for r in result.rounds)
    assert metric("spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert metric("spec_decode_round_latency_seconds_count") >= len(result.rounds)
    assert metric("spec_decode_gamma_count") >= len(result.rounds)
    assert metric("prefix_cache_queries_total") >= result.stats["prompt_tokens"]


def test_prometheus_endpoint_counts_prompt_tokens_taken_from_a_cache(traced):
    stack, _ = traced

    def counts() -> tuple[float, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{stack.opts.metrics_port}/metrics", timeout=10).read()
        lines = [line.rpartition(" ") for line in text.decode().splitlines() if line.startswith("prefix_cache_")]
        return tuple(sum(float(v) for k, _, v in lines if k.split("{")[0] == name)
                     for name in ("prefix_cache_queries_total", "prefix_cache_hits_total"))

    request = make_request(prompt="a prompt long enough that its ended session's cache is kept", max_new_tokens=4)
    generate(stack.endpoint, request)
    before = counts()
    again = generate(stack.endpoint, request)
    assert again.stats["cached_prompt_tokens"] == again.stats["prompt_tokens"] - 1
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (again.stats["prompt_tokens"],
                                                            again.stats["cached_prompt_tokens"])


def test_spans_reach_a_real_otlp_collector():
    grpc_port, http_port = free_port(), free_port()
    collector = subprocess.Popen([str(ROTEL), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
                                  "--otlp-http-endpoint", f"127.0.0.1:{http_port}", "--exporter", "blackhole",
                                  "--debug-log", "traces", "--debug-log-verbosity", "detailed"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(collector.stdout), daemon=True).start()
    try:
        opts = tiny_options(service=dict(otlp_endpoint=f"http://127.0.0.1:{grpc_port}"), orchestrator_process=True)
        with EmbeddedStack(opts) as stack:
            child = stack.orchestrator_child
            # Once (in about 10 CI runs) the orchestrator refused this call's connection, with nothing in its log:
            # wait for it to accept one, and otherwise say whether it had exited.
            with grpc.insecure_channel(stack.endpoint) as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=30)
                except grpc.FutureTimeoutError:
                    pytest.fail(f"the orchestrator at {stack.endpoint} printed its ready line but accepts no "
                                f"connection (exit code {child.proc.poll()})")
            generate(stack.endpoint, make_request(prompt="collector", max_new_tokens=12, gamma=2))
        # The stack's processes flush their span batches on shutdown.
        names = ("Name           : generate", "Name           : draft.compute", "Name           : target.compute")
        deadline = time.monotonic() + 20
        while not all(any(n in line for line in seen) for n in names) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        collector.terminate()
        collector.wait(10)
    output = "".join(seen)
    for name in names:
        assert name in output, f"{name!r} not received by the collector"
    assert "service.name: Str(specdec-target)" in output


def test_round_breakdown_splits_network_from_compute():
    def span(sid, parent, name, start_ms, end_ms, service="s", **attributes):
        return SpanRecord("t", sid, parent, name, service, int(start_ms * 1e6), int(end_ms * 1e6), attributes)

    spans = [span("r", "g", "round", 0, 100),
             span("dp", "r", "draft.propose", 1, 31),
             span("dc", "dp", "draft.compute", 6, 26, **{"specdec.forward_ms": 12.0, "specdec.wait_ms": 4.0}),
             span("dk", "dc", "kv.rollback", 6, 8),
             span("tv", "r", "target.verify", 32, 97),
             # The target exports no spans here: its client span's attributes stand in.
             ]
    spans[-1] = SpanRecord("t", "tv", "r", "target.verify", "s", 32_000_000, 97_000_000,
                           {"specdec.network_ms": 15.0, "specdec.rollback_ms": 1.0})
    (row,) = round_breakdown(spans)
    # The draft reports its passes (20 ms = 2 rollback + 12 forward + 4 waiting + 2 its own work); the
    # target reports none, so all its compute counts as forward passes.
    expected = {"draft forward": 12, "draft wait": 4, "draft service": 2, "kv rollback": 3, "network draft": 10,
                "target forward": 49, "target wait": 0, "target service": 0, "network target": 15, "orchestration": 5}
    for name in COMPONENTS:
        assert row[name] * 1e3 == pytest.approx(expected[name], abs=1e-6), name
    assert sum(row[n] for n in COMPONENTS) == pytest.approx(row["round"])
    # The draft's hop in its two directions, from its span's clock: 1 → 6 out, 26 → 31 back; the target's
    # service exported no span, so its directions are unknown (0), while its network total stands.
    directions = {"network draft request": 5, "network draft reply": 5, "network target request": 0,
                  "network target reply": 0}
    assert {name: round(row[name] * 1e3, 6) for name in DIRECTIONS} == directions


def test_profile_command_writes_breakdown_and_plot(tmp_path):
    output = tmp_path / "profile.json"
    cli = [sys.executable, "-m", "specdec.cli.main", "profile", "--draft-model", TINY_DRAFT, "--target-model",
           TINY_TARGET, "--device", "cpu", "--limit-prompts", "2", "--max-new-tokens", "24"]
    run = subprocess.run([*cli, "--output", str(output)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(output.read_text())
    assert summary["rounds"] > 0
    assert sum(summary["summary"][name]["share"] for name in COMPONENTS) == pytest.approx(1.0, abs=1e-6)
    assert all(summary["summary"][name]["share"] > 0
               for name in ("target forward", "target wait", "target service", "network target"))
    assert output.with_suffix(".png").stat().st_size > 10_000
    hop = {name: summary["summary"][name]["mean_ms"] for name in
           ("network target", "network target request", "network target reply")}
    assert hop["network target request"] > 0 and hop["network target reply"] > 0, hop
    assert hop["network target request"] + hop["network target reply"] == pytest.approx(hop["network target"]), hop
    spans = read_otlp_json(output.with_suffix(".spans.jsonl"))
    assert {s.service for s in spans} == {"specdec-orchestrator", "specdec-draft", "specdec-target"}
    measured = [s for s in spans if s.start_ns >= summary["measured_from_ns"]]
    assert summarise_breakdown(round_breakdown(measured)) == summary["summary"]
    # --spans reads the same file back: every round, the warm-up's included.
    again = tmp_path / "again.json"
    rerun = subprocess.run([*cli, "--spans", str(output.with_suffix(".spans.jsonl")), "--output", str(again)],
                           capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(again.read_text())["rounds"] == sum(s.name == "round" for s in spans) > summary["rounds"]


def test_each_generation_ends_with_one_line_in_the_operators_log(stack, caplog):
    """At info, the orchestrator says how each generation went: its end, tokens, time and speed, prompt (and what a
    cache held of it), rounds, and the drafted tokens accepted, the same counts as the client's stats."""
    caplog.set_level(logging.INFO, logger="orchestrator.generation")
    result = generate(stack.endpoint, make_request(prompt="log me", max_new_tokens=24, gamma=2))
    lines = [r.getMessage() for r in caplog.records if result.stats["session_id"] in r.getMessage()]
    assert len(lines) == 1, lines
    drafted, accepted = sum(r.drafted for r in result.rounds), sum(r.accepted for r in result.rounds)
    assert drafted > 0
    assert re.fullmatch(rf"session {result.stats['session_id']} finished \(length\): 24 tokens in [0-9.]+ s "
                        rf"\([0-9.]+ tok/s\), prompt {result.stats['prompt_tokens']} \(\d+ cached\), "
                        rf"{len(result.rounds)} rounds, {accepted} of {drafted} drafted tokens accepted", lines[0]), lines[0]
