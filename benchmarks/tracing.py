"""What the tracing instrumentation costs per round, with tracing off and on.

Times the orchestrator's real per-round instrumented path (`round` span, both `_Peer.traced_call`
client spans with context injection and attributes) against the same calls uninstrumented
(`_Peer.call`), with a stream that answers at once so that only the instrumentation differs.
"Off" is the default (no SDK: the hot path skips the API); "on" installs the SDK with a batch
processor into an exporter that drops the spans. Run in a child process, since an installed SDK
cannot be removed again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from orchestrator.generation import _Peer
from protos import specdec_pb2 as pb
from service_runtime import telemetry


class _InstantStream:
    def __init__(self, reply):
        self.reply = reply

    def call(self, request):
        return self.reply, 0.0


def _peer(reply) -> _Peer:
    peer = _Peer(client=None, session_id="bench")
    peer.stream = _InstantStream(reply)
    return peer


def _cost_us(rounds: int) -> float:
    """Instrumented minus plain per round, microseconds, in the current telemetry state."""
    draft = _peer(pb.DraftProposal(tokens=[1, 2, 3], compute_ns=1))
    target = _peer(pb.VerifyResult(tokens=[1, 2], compute_ns=1))

    def plain() -> None:
        draft.call(pb.DraftRequest(gamma=3))
        target.call(pb.VerifyRequest(draft_tokens=[1, 2, 3]))

    def instrumented() -> None:
        with telemetry.span("round") as span:
            draft.traced_call("draft.propose", pb.DraftRequest(gamma=3), span)
            target.traced_call("target.verify", pb.VerifyRequest(draft_tokens=[1, 2, 3]), span)

    timings = {}
    for name, body in (("plain", plain), ("instrumented", instrumented), ("plain2", plain)):
        began = time.perf_counter()
        for _ in range(rounds):
            body()
        timings[name] = time.perf_counter() - began
    baseline = min(timings["plain"], timings["plain2"])
    return 1e6 * max(timings["instrumented"] - baseline, 0.0) / rounds


def _measure(rounds: int) -> dict:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    off = _cost_us(rounds)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    telemetry._tracing = True
    on = _cost_us(rounds)
    provider.shutdown()
    return {"tracing_off_us_per_round": round(off, 2), "tracing_on_us_per_round": round(on, 2)}


def tracing_cost_us(rounds: int = 20000) -> dict:
    """{"tracing_off_us_per_round", "tracing_on_us_per_round"}, measured in a child process."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.tracing", str(rounds)], capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout)


if __name__ == "__main__":
    print(json.dumps(_measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)))
