"""Read spans exported as OTLP JSON and break each speculation round into where its time went.

Round time = per hop (forward passes + waiting for a pass + the service's own work + network)
+ KV rollback + orchestration:
- `draft.propose` / `target.verify` are the orchestrator's client spans of each hop;
- `draft.compute` / `target.compute` are the services' server spans inside them, each with a
  `kv.rollback` child, and the round's time in forward passes and waiting for them to begin as
  attributes (`specdec.forward_ms`, `specdec.wait_ms`); the service's own work (the sampler,
  bookkeeping, protobuf, handing a step to its pass and back) is the rest of the server span;
- network = client span − server span; orchestration = round − both client spans. Where the service exports
  its span, each hop's network splits into its two directions (`DIRECTIONS`, not summed into the round):
  request = server start − client start, reply = client end − server end. That reads two processes' clocks,
  so it means something on one host (or clocks kept in step); the sum does not depend on it.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

COMPONENTS = ("draft forward", "draft wait", "draft service", "target forward", "target wait", "target service",
              "kv rollback", "network draft", "network target", "orchestration")
HOPS = {"draft.propose": "draft", "target.verify": "target"}
WAYS = ("request", "reply")  # a hop's two directions
DIRECTIONS = tuple(f"network {hop} {way}" for hop in HOPS.values() for way in WAYS)


@dataclass(frozen=True)
class SpanRecord:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict, hash=False)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def otlp_id(value: str) -> str:
    """Trace/span ids as lowercase hex: OTLP JSON writes hex; protobuf's generic JSON writes base64."""
    if not value:
        return ""
    try:
        int(value, 16)
        if len(value) in (16, 32):
            return value.lower()
    except ValueError:
        pass
    return base64.b64decode(value).hex()


def _attribute_value(value: dict):
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return int(value["intValue"]) if "intValue" in value else None


def _attributes(items: list[dict]) -> dict:
    return {item["key"]: _attribute_value(item.get("value", {})) for item in items}


def parse_otlp_request(request: dict) -> list[SpanRecord]:
    """One ExportTraceServiceRequest in OTLP JSON -> its spans."""
    records = []
    for resource_spans in request.get("resourceSpans", []):
        service = _attributes(resource_spans.get("resource", {}).get("attributes", [])).get("service.name", "")
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                records.append(SpanRecord(otlp_id(span["traceId"]), otlp_id(span["spanId"]),
                                          otlp_id(span.get("parentSpanId", "")), span["name"], service,
                                          int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"]),
                                          _attributes(span.get("attributes", []))))
    return records


def read_otlp_json(path: str | Path) -> list[SpanRecord]:
    """Spans from a file of OTLP JSON lines (this project's --trace-file, or a Collector file exporter)."""
    spans = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            spans.extend(parse_otlp_request(json.loads(line)))
    return spans


def round_breakdown(spans: list[SpanRecord]) -> list[dict[str, float]]:
    """Seconds per component for every `round` span, in start order."""
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        children[span.parent_id].append(span)
    rows = []
    for round_span in sorted((s for s in spans if s.name == "round"), key=lambda s: s.start_ns):
        parts = dict.fromkeys((*COMPONENTS, *DIRECTIONS), 0.0)
        in_calls = 0.0
        for call in children[round_span.span_id]:
            hop = HOPS.get(call.name)
            if hop is None:
                continue
            in_calls += call.seconds
            servers = [s for s in children[call.span_id] if s.name == f"{hop}.compute"]
            if servers:
                compute = sum(s.seconds for s in servers)
                rollback = sum(k.seconds for s in servers for k in children[s.span_id] if k.name == "kv.rollback")
                timed = [s.attributes for s in servers]
                parts[f"network {hop} request"] += max(min(s.start_ns for s in servers) - call.start_ns, 0) / 1e9
                parts[f"network {hop} reply"] += max(call.end_ns - max(s.end_ns for s in servers), 0) / 1e9
            else:  # the service does not export spans: fall back on what the client span recorded
                compute = call.seconds - call.attributes.get("specdec.network_ms", call.seconds * 1e3) / 1e3
                rollback = call.attributes.get("specdec.rollback_ms", 0.0) / 1e3
                timed = [call.attributes]
            busy = max(compute - rollback, 0.0)
            # A service that does not report its passes: all of its time counts as forward passes.
            forward = min(sum(a.get("specdec.forward_ms", busy * 1e3) for a in timed) / 1e3, busy)
            wait = min(sum(a.get("specdec.wait_ms", 0.0) for a in timed) / 1e3, busy - forward)
            parts[f"{hop} forward"] += forward
            parts[f"{hop} wait"] += wait
            parts[f"{hop} service"] += busy - forward - wait
            parts["kv rollback"] += rollback
            parts[f"network {hop}"] += max(call.seconds - compute, 0.0)
        parts["orchestration"] = max(round_span.seconds - in_calls, 0.0)
        parts["round"] = round_span.seconds
        rows.append(parts)
    return rows


def summarise_breakdown(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per component: share of all round time, mean and p50/p95/p99 in milliseconds."""
    total = sum(r["round"] for r in rows) or 1.0
    summary = {}
    for name in (*COMPONENTS, *DIRECTIONS, "round"):
        values = np.array([r[name] for r in rows]) * 1e3
        p50, p95, p99 = np.percentile(values, [50, 95, 99]) if len(values) else (0.0, 0.0, 0.0)
        summary[name] = {"share": float(values.sum() / 1e3 / total), "mean_ms": float(values.mean()) if len(values) else 0.0,
                         "p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99)}
    return summary
