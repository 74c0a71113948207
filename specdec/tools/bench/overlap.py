"""`specdec bench --overlap-rtt 0,5,20,50`: drafting during verification against drafting before it.

Both hops go through loopback delay proxies that add the RTT. Per RTT, and per prompt in turn:
target-only, hybrid without overlap, hybrid with overlap on, and hybrid with overlap auto (the γ
controller's choice). Run it twice: co-located (both services on every CPU) and with each service
pinned to its own CPUs (`--draft-cpus 0 --target-cpus 1`), which stands in for separate machines;
every row says which. It prints tok/s, × target-only, × hybrid without overlap, the overlap hit rate,
α and the accepted length, and writes JSON and a PNG of tok/s against RTT.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.tools.bench.speed import load_prompts, run_configs, save_rows, service_infos, warm_up

CONFIGS = (("target-only", 0, {"overlap": "off"}), ("hybrid", None, {"proposer": "hybrid", "overlap": "off"}),
           ("hybrid+overlap", None, {"proposer": "hybrid", "overlap": "on"}),
           ("hybrid+auto", None, {"proposer": "hybrid", "overlap": "auto"}))
COLUMNS = ("rtt_ms", "config", "tokens_per_s", "speedup", "over_no_overlap", "overlap_hit_rate", "alpha",
           "mean_accepted_length", "same_as_target_only")


def placement(args: argparse.Namespace) -> str:
    if args.draft_cpus or args.target_cpus:
        return f"pinned: draft on CPUs {args.draft_cpus or 'all'}, target on CPUs {args.target_cpus or 'all'}"
    return "co-located: both services on every CPU"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_overlap_sweep(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = load_prompts(args.prompts, args.limit_prompts)
    where = placement(args)
    rows: list[dict] = []
    with EmbeddedStack(stack_options(args, delay_proxies=True)) as stack:
        _, target_info = service_infos(stack)
        warm_up(stack.endpoint, prompts[0]["prompt"], args.gamma_max)
        for rtt in [float(r) for r in args.overlap_rtt.split(",")]:
            stack.set_rtt_ms(rtt, rtt)
            results = run_configs(stack.endpoint, list(CONFIGS), prompts, args.max_new_tokens, desc=f"rtt {rtt:g} ms")
            baseline, plain = results[0], results[1]
            for result in results:
                rows.append({"rtt_ms": rtt, "placement": where, "config": result.name,
                             "tokens_per_s": round(result.tokens_per_s, 3),
                             "speedup": round(result.tokens_per_s / baseline.tokens_per_s, 3),
                             "over_no_overlap": round(result.tokens_per_s / plain.tokens_per_s, 3),
                             "overlap_hit_rate": _rounded(result.hit_rate()), "alpha": _rounded(result.alpha()),
                             "mean_accepted_length": _rounded(result.mean_accepted_length()),
                             "same_as_target_only": result.outputs == baseline.outputs})
    print(f"machine: {target_info.hardware}; path {target_info.compute_path} ({target_info.kernel}); {where}; "
          f"{args.max_new_tokens} tokens per prompt, {len(prompts)} prompts, greedy, configs interleaved per prompt")
    print(" | ".join(COLUMNS))
    for row in rows:
        print(" | ".join(str(row[k]) for k in COLUMNS))
    save_rows(args.output, target_info, args.max_new_tokens, rows, plot)
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config in dict.fromkeys(r["config"] for r in rows):
        points = [(r["rtt_ms"], r["tokens_per_s"]) for r in rows if r["config"] == config]
        ax.plot(*zip(*points), marker="o", label=config)
    ax.set(xlabel="added round-trip time per hop (ms)", ylabel="tokens / s",
           title=f"drafting during verification ({rows[0]['placement'].split(':')[0]})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
