"""`specdec bench --tp-sweep 1,2`: the target at each tensor-parallel size, same models and prompts.

Per size it reports resident memory and weight bytes per worker, the target's step time
(target-only rounds), verify time as a function of the number of tokens scored, and
end-to-end tokens/s of target-only, fixed γ and adaptive generation. Outputs must be
identical across sizes (greedy).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import grpc

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.runtime.server import CHANNEL_OPTIONS
from specdec.tools.bench.speed import load_prompts, run_configs, warm_up

MIB = 2**20


def _rank_memory(address: str) -> list[dict]:
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        info = pb_grpc.TargetServiceStub(channel).Info(pb.ModelInfoRequest(), timeout=60)
    return [{"rank": r.rank, "resident_mib": round(r.resident_bytes / MIB), "weights_mib": round(r.parameter_bytes / MIB)}
            for r in info.ranks]


def _verify_ms_by_drafted(results) -> dict[int, float]:
    """Median target compute per round, keyed by draft tokens scored (0 = a plain decode step)."""
    by_drafted: dict[int, list[float]] = {}
    for res in results:
        for r in res.rounds[1:]:  # the first round holds the prompt's prefill
            by_drafted.setdefault(r.drafted, []).append(r.target_compute_s)
    return {k: round(1e3 * statistics.median(v), 1) for k, v in sorted(by_drafted.items())}


def run_tp_sweep(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = load_prompts(args.prompts, args.limit_prompts)
    sizes = [int(n) for n in args.tp_sweep.split(",")]
    gammas = args.gammas
    configs = [("target-only", 0), *[(f"γ={g}", g) for g in gammas], ("adaptive", None)]
    rows, outputs = [], {}
    for size in sizes:
        opts = stack_options(args, gamma_max=max([args.gamma_max, *gammas]), target_tp=size)
        with EmbeddedStack(opts) as stack:
            step = warm_up(stack.endpoint, prompts[0]["prompt"], args.gamma_max)
            results = run_configs(stack.endpoint, configs, prompts, args.max_new_tokens, desc=f"tp={size}")
            memory = _rank_memory(stack.target_address)
        outputs[size] = [res.outputs for res in results]
        rows.append({"tp": size, "ranks": memory, "target_step_ms": round(1e3 * step, 1),
                     "verify_ms_by_drafted": _verify_ms_by_drafted(results),
                     "tokens_per_s": {res.name: round(res.tokens_per_s, 3) for res in results}})
    identical = all(out == outputs[sizes[0]] for out in outputs.values())
    for row in rows:
        print(f"tp={row['tp']}: target step {row['target_step_ms']} ms; verify ms by drafted tokens "
              f"{row['verify_ms_by_drafted']}")
        for rank in row["ranks"]:
            print(f"  rank {rank['rank']}: resident {rank['resident_mib']} MiB, weights {rank['weights_mib']} MiB")
        print("  tokens/s: " + ", ".join(f"{k} {v}" for k, v in row["tokens_per_s"].items()))
    print(f"outputs identical across tp sizes: {identical}")
    Path(args.output).write_text(json.dumps({"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                                             "rows": rows, "identical_across_sizes": identical}, indent=2))
    print(f"wrote {args.output}")
    return 0 if identical else 1
