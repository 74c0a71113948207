"""Speculative-decoding metrics through OpenTelemetry, under the names vLLM users dashboard.

Recorded through the API: no-ops unless `specdec.runtime.telemetry.configure` installed a
MeterProvider (Prometheus scrape endpoint and/or OTLP export).
"""

from __future__ import annotations

from opentelemetry import metrics

from specdec.core.rounds import RoundRecord

ROUND_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class SpecDecodeMetrics:
    def __init__(self, gamma_max: int):
        meter = metrics.get_meter("specdec")
        self.num_drafts = meter.create_counter(
            "spec_decode_num_drafts", description="Speculation rounds that proposed at least one draft token")
        self.num_draft_tokens = meter.create_counter(
            "spec_decode_num_draft_tokens", description="Draft tokens proposed")
        self.num_accepted_tokens = meter.create_counter(
            "spec_decode_num_accepted_tokens", description="Draft tokens accepted by the target")
        self.accepted_per_pos = meter.create_counter(
            "spec_decode_num_accepted_tokens_per_pos", description="Accepted draft tokens by position in the draft")
        self.round_latency = meter.create_histogram(
            "spec_decode_round_latency", unit="s", description="Wall time of one speculate/verify round",
            explicit_bucket_boundaries_advisory=ROUND_LATENCY_BUCKETS_S)
        self.network_latency = meter.create_histogram(
            "spec_decode_network_latency", unit="s", description="Network time of one round trip, per hop",
            explicit_bucket_boundaries_advisory=ROUND_LATENCY_BUCKETS_S)
        self.gamma = meter.create_histogram(
            "spec_decode_gamma", description="γ chosen per round (0 = target-only step)",
            explicit_bucket_boundaries_advisory=tuple(float(g) + 0.5 for g in range(gamma_max)))
        self.prefix_cache_queries = meter.create_counter(
            "prefix_cache_queries", description="Prompt tokens of generations that started")
        self.prefix_cache_hits = meter.create_counter(
            "prefix_cache_hits", description="Of those, the tokens the target took from a kept or live KV cache")

    def record_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A generation's prompt, once its first round is done."""
        self.prefix_cache_queries.add(prompt_tokens)
        self.prefix_cache_hits.add(cached_tokens)

    def record(self, r: RoundRecord) -> None:
        self.gamma.record(r.gamma)
        self.round_latency.record(r.wall_s)
        self.network_latency.record(r.rtt_target_s, {"hop": "target"})
        if r.drafted:
            self.network_latency.record(r.rtt_draft_s, {"hop": "draft"})
            self.num_drafts.add(1)
            self.num_draft_tokens.add(r.drafted)
            self.num_accepted_tokens.add(r.accepted)
            for position in range(r.accepted):
                self.accepted_per_pos.add(1, {"position": position})
