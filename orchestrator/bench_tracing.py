"""What the tracing instrumentation costs per round when tracing is off (no SDK installed).

Times the orchestrator's real per-round instrumented path (`round` span, both `_Peer.traced_call`
client spans with context injection) against the same calls uninstrumented (`_Peer.call`),
with a stream that answers at once so that only the instrumentation differs.
"""

from __future__ import annotations

import time

from opentelemetry import trace

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


def tracing_off_cost_us(rounds: int = 20000) -> float | None:
    """Microseconds of instrumentation per round with the no-op API; None if an SDK is installed."""
    if type(trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        return None
    draft = _peer(pb.DraftProposal(tokens=[1, 2, 3], compute_ns=1))
    target = _peer(pb.VerifyResult(tokens=[1, 2], compute_ns=1))
    draft_request, target_request = pb.DraftRequest(gamma=3), pb.VerifyRequest(draft_tokens=[1, 2, 3])

    def plain() -> None:
        draft.call(draft_request)
        target.call(target_request)

    def instrumented() -> None:
        with telemetry.span("round") as span:
            draft.traced_call("draft.propose", draft_request, span)
            target.traced_call("target.verify", target_request, span)

    timings = {}
    for name, body in (("plain", plain), ("instrumented", instrumented), ("plain2", plain)):
        began = time.perf_counter()
        for _ in range(rounds):
            body()
        timings[name] = time.perf_counter() - began
    baseline = min(timings["plain"], timings["plain2"])
    return 1e6 * max(timings["instrumented"] - baseline, 0.0) / rounds
