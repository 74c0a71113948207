"""`specdec bench --rtt-ms 0,5,20,50`: adaptive γ against every fixed γ, through loopback delay proxies.

For each RTT (added on both hops) it reports tokens/s of each policy, the best fixed γ in
hindsight and adaptive / best-fixed. A mixed workload then alternates prompt type and RTT
between requests. It writes JSON and a PNG of tokens/s against RTT.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from specdec.cli.client import generate, make_request
from specdec.tools.bench.speed import load_prompts, run_configs, warm_up

FIXED_GAMMAS = (0, 1, 2, 3, 4, 6)


def _policies(gamma_max: int) -> list[tuple[str, int | None]]:
    return [(f"γ={g}", g) for g in FIXED_GAMMAS if g <= gamma_max] + [("adaptive", None)]


def _mixed_workload(stack, prompts: list[dict], rtts: list[float], policies: list[tuple[str, int | None]],
                    n: int) -> dict[str, float]:
    """tokens/s per policy over requests that alternate prompt type and RTT.

    Every request of the sequence runs under each policy in turn (round-robin), so slow drift of
    the machine hits all policies alike.
    """
    tokens = {name: 0 for name, _ in policies}
    seconds = {name: 0.0 for name, _ in policies}
    for i, prompt in enumerate(tqdm(prompts * 2, desc="mixed")):
        rtt = rtts[i % len(rtts)] if i % 2 else rtts[-1 - i % len(rtts)]
        stack.set_rtt_ms(rtt, rtt)
        for name, gamma in policies:
            began = time.perf_counter()
            out = generate(stack.endpoint, make_request(prompt=prompt["prompt"], max_new_tokens=n, gamma=gamma))
            seconds[name] += time.perf_counter() - began
            tokens[name] += len(out.token_ids)
    return {name: tokens[name] / seconds[name] for name in tokens}


def plot(per_rtt: dict[float, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rtts = sorted(per_rtt)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in per_rtt[rtts[0]]:
        style = dict(linewidth=3, color="black") if name == "adaptive" else dict(linewidth=1.2, marker="o")
        ax.plot(rtts, [per_rtt[r][name] for r in rtts], label=name, **style)
    ax.set_xlabel("added round-trip time per hop (ms)")
    ax.set_ylabel("tokens / s")
    ax.set_title("Speculative decoding throughput against network delay")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_rtt_sweep(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = load_prompts(args.prompts, args.limit_prompts)
    rtts = [float(r) for r in args.rtt_ms.split(",")]
    policies = _policies(args.gamma_max)
    per_rtt: dict[float, dict[str, float]] = {}
    with EmbeddedStack(stack_options(args, delay_proxies=True)) as stack:
        warm_up(stack.endpoint, prompts[0]["prompt"], args.gamma_max)
        for rtt in rtts:
            stack.set_rtt_ms(rtt, rtt)
            results = run_configs(stack.endpoint, policies, prompts, args.max_new_tokens, desc=f"rtt {rtt:g} ms")
            per_rtt[rtt] = {res.name: res.tokens_per_s for res in results}
        mixed = _mixed_workload(stack, prompts, rtts, policies, args.max_new_tokens)
    rows = []
    for rtt, speeds in [*per_rtt.items(), ("mixed", mixed)]:
        fixed = {k: v for k, v in speeds.items() if k != "adaptive"}
        best = max(fixed, key=fixed.get)
        rows.append({"rtt_ms": rtt, **{k: round(v, 3) for k, v in speeds.items()}, "best_fixed": best,
                     "adaptive_over_best_fixed": round(speeds["adaptive"] / fixed[best], 3)})
    names = [name for name, _ in policies]
    header = ["rtt_ms", *names, "best_fixed", "adaptive/best"]
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[k]) for k in ["rtt_ms", *names, "best_fixed", "adaptive_over_best_fixed"]))
    output = Path(args.output)
    output.write_text(json.dumps({"max_new_tokens": args.max_new_tokens, "prompts": len(prompts), "rows": rows},
                                 indent=2))
    plot(per_rtt, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0
