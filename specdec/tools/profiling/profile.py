"""`specdec profile`: where the speculation loop's time goes, from its spans.

Runs a workload on the embedded stack with every process writing spans to one OTLP JSON file
(or reads such a file with `--spans`), splits each round into, per service, its forward passes, its
wait for them and its own work, then KV rollback, network per hop and orchestration
(`specdec.tools.profiling.spans`), prints share and p50/p95/p99 per component,
and writes a PNG of the per-round breakdown.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from specdec.cli.client import generate, make_request
from specdec.tools.bench.speed import load_prompts, warm_up
from specdec.tools.profiling.spans import (COMPONENTS, DIRECTIONS, WAYS, read_otlp_json, round_breakdown,
                                            summarise_breakdown)


def run_workload(args: argparse.Namespace) -> int:
    """Generate over the prompts with every process tracing into `args.trace_file`.

    Returns the wall-clock time (ns) at which the measured part began, after a warm-up.
    """
    from opentelemetry import trace

    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    with EmbeddedStack(stack_options(args, delay_proxies=args.rtt_ms > 0)) as stack:
        prompts = load_prompts(args.prompts, args.limit_prompts)
        warm_up(stack.endpoint, prompts[0]["prompt"], args.gamma_max)
        if args.rtt_ms > 0:
            stack.set_rtt_ms(args.rtt_ms, args.rtt_ms)
        measured_from = time.time_ns()
        for p in tqdm(prompts, desc="profile"):
            generate(stack.endpoint, make_request(prompt=p["prompt"], max_new_tokens=args.max_new_tokens,
                                                  gamma=args.gamma))
    trace.get_tracer_provider().force_flush()  # the services flushed on exit; now this process
    return measured_from


def print_summary(summary: dict, rounds: int) -> None:
    print(f"{rounds} rounds; mean round {summary['round']['mean_ms']:.1f} ms")
    print(f"{'component':>16} | share  |  mean ms |   p50 ms |   p95 ms |   p99 ms")
    for name in COMPONENTS:
        _print_row(name, summary[name])
        for way in WAYS:  # a hop's two directions, where the service exports its span
            part = f"{name} {way}"
            if part in DIRECTIONS and summary[part]["mean_ms"] > 0:
                _print_row(f"of which {way}", summary[part])


def _print_row(name: str, s: dict) -> None:
    print(f"{name:>16} | {100 * s['share']:5.1f}% | {s['mean_ms']:8.2f} | {s['p50_ms']:8.2f} | "
          f"{s['p95_ms']:8.2f} | {s['p99_ms']:8.2f}")


def plot(rows: list[dict], summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (timeline, share) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [4, 1]})
    shown = rows[:200]
    bottom, share_bottom = [0.0] * len(shown), 0.0
    for name in COMPONENTS:
        values = [1e3 * r[name] for r in shown]
        timeline.bar(range(len(shown)), values, bottom=bottom, width=1.0, label=name)
        percent = 100 * summary[name]["share"]
        share.bar([0], [percent], bottom=[share_bottom])
        bottom, share_bottom = [b + v for b, v in zip(bottom, values)], share_bottom + percent
    timeline.set_xlabel("round")
    timeline.set_ylabel("ms")
    timeline.set_title(title)
    timeline.legend(fontsize=8)
    share.set_xticks([])
    share.set_ylabel("% of round time")
    share.set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_profile(args: argparse.Namespace) -> int:
    measured_from = 0
    if not args.spans:
        Path(args.trace_file).write_text("")
        measured_from = run_workload(args)
    source = args.spans or args.trace_file
    rows = round_breakdown([s for s in read_otlp_json(source) if s.start_ns >= measured_from])
    if not rows:
        print(f"no `round` spans in {source}")
        return 1
    summary = summarise_breakdown(rows)
    print_summary(summary, len(rows))
    output = Path(args.output)
    output.write_text(json.dumps({"source": str(source), "measured_from_ns": measured_from, "rounds": len(rows),
                                         "summary": summary}, indent=2))
    title = f"round time breakdown ({Path(source).name}" + (f", +{args.rtt_ms:g} ms RTT)" if args.rtt_ms else ")")
    plot(rows, summary, output.with_suffix(".png"), title)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0
