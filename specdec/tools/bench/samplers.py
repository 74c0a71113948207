"""`specdec bench --samplers 0.7,1.0`: the coupled sampler against the rejection sampler, sampled, in one run on
the same models, prompts and seeds.

Per temperature (top-p 0.95) and speculation (adaptive γ with the server's proposer, and each fixed γ of
`--gammas`), each prompt and seed runs under each sampler, the two in alternating order, and once target-only
with the coupled sampler. It prints tok/s, the share of drafted tokens accepted and the mean tokens a round for
each sampler, and how many coupled outputs equal their target-only output (all of them, on a row-invariant
path: the claim). Then, per position, on the two models' logits along the first prompt and its output: how
often the coupled draws of draft and target agree over seeds, against 1 − TV(p, q), the rejection sampler's
expected acceptance there (a cleaner comparison than whole generations', whose text differs by sampler).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec import weights
from specdec.cli.client import GenerateResult, generate, make_request
from specdec.core.coupling import coupled_tokens
from specdec.core.params import SamplingParams
from specdec.core.sampling import filtered_logits
from specdec.tools.bench.speed import load_prompts, service_infos, warm_up

SAMPLERS = ("coupled", "rejection")
TOP_P = 0.95
AGREEMENT_SEEDS = 40  # seeds per position in the per-position comparison


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


def position_agreement(args: argparse.Namespace, text: str, temperatures: list[float]) -> list[dict]:
    """Per temperature: the share of (position, seed) where the draft's and the target's coupled draws agree, and
    the mean 1 − TV(p, q), over the positions of `text` (the models loaded here as the services load them)."""
    from specdec.engine.models import load_model
    from specdec.engine.runner import Step
    from specdec.weights.sources import load_tokenizer

    ids = load_tokenizer(weights.resolve(args.target_model))(text).input_ids
    logits = {}
    for name, spec, draft_weights in (("draft", args.draft_model, args.draft_weights),
                                      ("target", args.target_model, "as-shipped")):
        runner = load_model(weights.resolve(spec), args.device, args.dtype, args.quantize,
                            draft_weights=draft_weights).runner
        logits[name] = runner.forward([Step(runner.new_cache(), ids, logits=len(ids) - 1)])[0]  # [n, V]
    vocab = min(t.shape[-1] for t in logits.values())
    rows = []
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature, top_p=TOP_P)
        p, q = (filtered_logits(logits[name][:, :vocab], params) for name in ("target", "draft"))
        agree = sum(coupled_tokens(p[i:i + 1], seed, i) == coupled_tokens(q[i:i + 1], seed, i)
                    for i in range(p.shape[0]) for seed in range(AGREEMENT_SEEDS)) / (p.shape[0] * AGREEMENT_SEEDS)
        tv = 0.5 * (p.softmax(-1) - q.softmax(-1)).abs().sum(-1)  # [n]
        rows.append({"temperature": temperature, "positions": p.shape[0], "coupled_agreement": round(agree, 3),
                     "one_minus_tv": round(1 - float(tv.mean()), 3), "coupling_bound": round(float(
                         ((1 - tv) / (1 + tv)).mean()), 3)})
    return rows


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

        first_output = run(prompts[0], temperatures[0], 0, "coupled", 0).text
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
    agreement = position_agreement(args, prompts[0] + first_output, temperatures)
    for row in agreement:
        print(f"T = {row['temperature']}, per position ({row['positions']} × {AGREEMENT_SEEDS} seeds): coupled draws "
              f"agree {row['coupled_agreement']}, 1 − TV {row['one_minus_tv']} (the rejection sampler's acceptance), "
              f"(1 − TV)/(1 + TV) {row['coupling_bound']}")
    print(f"({target_info.hardware}, {target_info.compute_path}, top-p {TOP_P}, {args.max_new_tokens} tokens)")
    Path(args.output).write_text(json.dumps({"hardware": target_info.hardware, "path": target_info.compute_path,
                                             "top_p": TOP_P, "rows": rows, "per_position": agreement}, indent=2))
    print(f"wrote {args.output}")
    return 0
