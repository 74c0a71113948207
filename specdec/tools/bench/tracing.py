"""What the tracing instrumentation costs per round, with tracing off and on.

Times the orchestrator's real per-round call path (a `round` span around `DraftSession.propose`
and `TargetSession.verify`, with their client spans, context injection and attributes) against
streams that answer at once, so that only the orchestrator's own work is timed. "Off" is the
default (no SDK: the hot path skips the API); "on" installs the SDK with a batch processor into an
exporter that drops the spans. Run in a child process, since an installed SDK cannot be removed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from orchestrator.sessions import DraftSession, TargetSession
from protos import specdec_pb2 as pb
from specdec.runtime import telemetry


class _InstantStream:
    def __init__(self, reply):
        self.reply = reply

    def call(self, request, timeout=None):
        return self.reply, 0.0

    def close(self) -> None:
        pass


def _round_us(rounds: int) -> float:
    """Microseconds per round of the orchestrator's call path, in the current telemetry state."""
    draft = DraftSession(None, "bench", pb.SamplingParams())
    target = TargetSession(None, "bench", pb.SamplingParams())
    draft.stream = _InstantStream(pb.DraftProposal(tokens=[1, 2, 3], compute_ns=1))
    target.stream = _InstantStream(pb.VerifyResult(tokens=[1, 2], compute_ns=1))
    committed = [5, 6, 7, 8]
    began = time.perf_counter()
    for _ in range(rounds):
        with telemetry.span("round") as span:
            proposal = draft.propose(committed, 3, 0.0, span, timeout=1.0)
            target.verify(committed, proposal, span, timeout=1.0)
    return 1e6 * (time.perf_counter() - began) / rounds


def _measure(rounds: int) -> dict:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    _round_us(rounds // 10)  # warm up
    off = _round_us(rounds)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    telemetry.install_tracer_provider(provider)
    on = _round_us(rounds)
    provider.shutdown()
    return {"round_path_us_tracing_off": round(off, 2), "round_path_us_tracing_on": round(on, 2)}


def tracing_cost_us(rounds: int = 20000) -> dict:
    """{"round_path_us_tracing_off", "round_path_us_tracing_on"}, measured in a child process."""
    out = subprocess.run([sys.executable, "-m", "specdec.tools.bench.tracing", str(rounds)], capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout)


if __name__ == "__main__":
    print(json.dumps(_measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)))
