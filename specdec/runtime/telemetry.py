"""OpenTelemetry setup shared by the three servers: traces, metrics, and context on the wire.

Configured the standard way: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `--otlp-endpoint`),
`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, and the SDK's batch
settings (`OTEL_BSP_*`). `--trace-file` also writes spans as OTLP JSON lines, the format the
OpenTelemetry Collector's file exporter writes and `specdec profile --spans` reads.
`--metrics-port` serves Prometheus metrics. With none of these set no SDK is installed and
every span or metric call goes to the API's no-op implementation.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
from typing import TYPE_CHECKING, Sequence

from google.protobuf.json_format import MessageToDict
from opentelemetry import propagate, trace
from opentelemetry.trace import Span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExportResult

log = logging.getLogger(__name__)
TRACER_NAME = "specdec"


class Telemetry:
    """What `configure` installed; `shutdown` flushes spans and metrics still buffered."""

    def __init__(self, tracer_provider=None, meter_provider=None):
        self.tracer_provider, self.meter_provider = tracer_provider, meter_provider

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()


def _grpc_endpoint(endpoint: str) -> str:
    return endpoint if "://" in endpoint else f"http://{endpoint}"  # no scheme: plaintext, as on loopback


def configure(default_service_name: str, otlp_endpoint: str = "", trace_file: str = "",
              metrics_port: int = 0, metrics_host: str = "127.0.0.1", prometheus: bool = False) -> Telemetry:
    """Install the SDK for what is configured; leaves the no-op API in place otherwise.

    `prometheus`: keep metrics in prometheus_client's registry for a server of this process to
    expose (the HTTP API's /metrics), as `metrics_port` does on a port of its own."""
    if not (otlp_endpoint or trace_file or metrics_port or prometheus):
        return Telemetry()
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or default_service_name})
    tracer_provider = meter_provider = None
    if otlp_endpoint or trace_file:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)  # sampler from OTEL_TRACES_SAMPLER
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(_grpc_endpoint(otlp_endpoint))))
        if trace_file:
            tracer_provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter(trace_file)))
        install_tracer_provider(tracer_provider)
    if otlp_endpoint or metrics_port or prometheus:
        meter_provider = _meter_provider(resource, otlp_endpoint, metrics_port, metrics_host, prometheus)
    log.info("telemetry: traces %s, metrics %s", otlp_endpoint or trace_file or "off",
             ", ".join(filter(None, [otlp_endpoint, metrics_port and f"prometheus :{metrics_port}"])) or "off")
    return Telemetry(tracer_provider, meter_provider)


def _meter_provider(resource, otlp_endpoint: str, metrics_port: int, metrics_host: str, prometheus: bool):
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    readers = []
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(_grpc_endpoint(otlp_endpoint))))
    if metrics_port or prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        if metrics_port:
            start_http_server(metrics_port, addr=metrics_host)  # the service's own host, not every interface
        readers.append(PrometheusMetricReader())
    provider = MeterProvider(resource=resource, metric_readers=readers)
    metrics.set_meter_provider(provider)
    return provider


_TRACER = trace.get_tracer(TRACER_NAME)  # a proxy: it follows a provider installed later
_tracing = False  # set by `configure`; hot paths skip the (no-op) API entirely while False


def tracer():
    return _TRACER


def tracing_enabled() -> bool:
    return _tracing


def install_tracer_provider(provider) -> None:
    """Make `provider` the global one and turn the instrumented hot paths on."""
    global _tracing
    trace.set_tracer_provider(provider)
    _tracing = True


def span(name: str, **kwargs):
    """`start_as_current_span`, or a null context yielding a non-recording span when tracing is off."""
    if not _tracing:
        return contextlib.nullcontext(trace.INVALID_SPAN)
    return _TRACER.start_as_current_span(name, **kwargs)


def inject(carrier, span: Span | None = None) -> None:
    """Write the W3C context of `span` (default: the current span) into a protobuf map field (no-op
    when untraced)."""
    propagate.inject(carrier, context=None if span is None else trace.set_span_in_context(span))


def extract(carrier):
    """The remote parent context carried in a protobuf map field."""
    return propagate.extract(dict(carrier))


def child_span(parent: Span, name: str, start_ns: int, end_ns: int, attributes: dict | None = None) -> None:
    """Record an already finished child span of `parent` with explicit timestamps."""
    span = tracer().start_span(name, context=trace.set_span_in_context(parent), start_time=start_ns,
                               attributes=attributes)
    span.end(end_time=end_ns)


class OtlpJsonFileExporter:
    """A SpanExporter appending one OTLP `ExportTraceServiceRequest` JSON object per line.

    Several processes may share the file: each batch is one O_APPEND write.
    """

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence) -> SpanExportResult:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        request = MessageToDict(encode_spans(spans))
        for resource_spans in request.get("resourceSpans", []):  # OTLP JSON writes ids in hex, not base64
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = base64.b64decode(span[key]).hex()
        line = json.dumps(request, separators=(",", ":")) + "\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
