"""`specdec bench --samplers 0.7,1.0`: the coupled sampler against the rejection sampler, sampled, in one run on
the same models, prompts and seeds.

Per temperature (top-p 0.95) and speculation (adaptive γ with the server's proposer, and each fixed γ of
`--gammas`), each prompt and seed runs under each sampler, the two in alternating order, and once target-only
with the coupled sampler. It prints tok/s, the share of drafted tokens accepted and the mean tokens a round for
each sampler, and how many coupled outputs equal their target-only output (all of them, on a row-invariant
path: the claim).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.cli.client import GenerateResult, generate, make_request
from specdec.tools.bench.speed import load_prompts, service_infos, warm_up

SAMPLERS = ("coupled", "rejection")
TOP_P = 0.95


def tally(results: list[GenerateResult]) -> dict:
    """tok/s, drafts accepted / drafted, and tokens a round over `results`."""
    tokens = sum(len(r.token_ids) for r in results)
    drafted = sum(x.drafted for r in results for x in r.rounds)
    accepted = sum(x.accepted for r in results for x in r.rounds)
    rounds = sum(len(r.rounds) for r in results)
    return {"tokens_per_s": round(tokens / sum(r.seconds for r in results), 2), "drafted": drafted,
            "accepted": accepted, "acceptance": round(accepted / drafted, 3) if drafted else None,
            "tokens_per_round": round(tokens / rounds, 2) if rounds else None}


def compare(run, prompts: list[str], temperature: float, gamma: int | None, repeats: int) -> dict:
    """One row: every prompt and seed under each sampler (alternating which goes first), and target-only."""
    runs = {sampler: [] for sampler in SAMPLERS}
    same = 0
    for seed in range(repeats):
        for k, prompt in enumerate(prompts):
            for sampler in SAMPLERS if (seed + k) % 2 == 0 else SAMPLERS[::-1]:
                runs[sampler].append(run(prompt, temperature, seed, sampler, gamma))
            same += run(prompt, temperature, seed, "coupled", 0).token_ids == runs["coupled"][-1].token_ids
    return {"temperature": temperature, "speculation": "adaptive" if gamma is None else f"γ = {gamma}",
            "outputs": len(runs["coupled"]), "coupled_equal_target_only": same,
            **{sampler: tally(results) for sampler, results in runs.items()}}


def run_samplers(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = [p["prompt"] for p in load_prompts(args.prompts, args.limit_prompts)]
    temperatures = [float(t) for t in args.samplers.split(",")]
    rows = []
    with EmbeddedStack(stack_options(args)) as stack:
        _, target_info = service_infos(stack)
        warm_up(stack.endpoint, prompts[0], args.gamma_max)

        def run(prompt: str, temperature: float, seed: int, sampler: str, gamma: int | None) -> GenerateResult:
            request = make_request(prompt=prompt, max_new_tokens=args.max_new_tokens, temperature=temperature,
                                   top_p=TOP_P, seed=seed, sampler=sampler, gamma=gamma)
            return generate(stack.endpoint, request, timeout=600)

        for temperature in temperatures:
            for gamma in (None, *args.gammas):
                rows.append(row := compare(run, prompts, temperature, gamma, args.repeats))
                coupled, rejection = row["coupled"], row["rejection"]
                print(f"T = {temperature}, {row['speculation']}: coupled {coupled['tokens_per_s']:.2f} tok/s, "
                      f"{coupled['acceptance']} of drafts accepted, {coupled['tokens_per_round']} tokens a round; "
                      f"rejection {rejection['tokens_per_s']:.2f} tok/s, {rejection['acceptance']}, "
                      f"{rejection['tokens_per_round']}; coupled / rejection "
                      f"×{coupled['tokens_per_s'] / rejection['tokens_per_s']:.2f}; coupled outputs equal to "
                      f"target-only: {row['coupled_equal_target_only']} of {row['outputs']}")
    print(f"({target_info.hardware}, {target_info.compute_path}, top-p {TOP_P}, {args.max_new_tokens} tokens)")
    Path(args.output).write_text(json.dumps({"hardware": target_info.hardware, "path": target_info.compute_path,
                                             "top_p": TOP_P, "rows": rows}, indent=2))
    print(f"wrote {args.output}")
    return 0
