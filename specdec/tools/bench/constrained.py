"""`specdec bench --constrained`: structured output's cost, in one run on the same models and prompts.

A JSON schema (an enum, a bounded integer, a short string: every answer can complete within the token
limit) constrains target-only and adaptive decoding, beside the same two unconstrained. It prints tok/s,
how many answers parse and follow the schema, whether speculation changed an answer, and the mask's cost
per verified row on the target's vocabulary (measured in this process on the target's tokenizer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specdec import weights
from specdec.cli.client import generate, make_request
from specdec.core.grammar import compile_constraint
from specdec.tools.bench.speed import load_prompts, service_infos, warm_up

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "language": {"enum": ["python", "rust", "go"]},
                                           "lines": {"type": "integer", "minimum": 0, "maximum": 9999}},
          "required": ["name", "language", "lines"], "additionalProperties": False}


def follows_schema(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == {"name", "language", "lines"}
            and value["language"] in ("python", "rust", "go") and isinstance(value["lines"], int))


def mask_ms(target: str, vocab: int) -> tuple[float, float]:
    """(median, max) ms per row of `GrammarState.masks` along a valid answer, 5 rows a call."""
    from specdec.engine.constraint import Grammars
    from specdec.weights.sources import load_tokenizer

    state = Grammars(target, vocab).state(compile_constraint("json_schema", json.dumps(SCHEMA)))
    ids = load_tokenizer(target)(json.dumps({"name": "fibonacci", "language": "python", "lines": 12})).input_ids
    times = []
    for k in range(len(ids)):
        began = time.perf_counter()
        state.masks(ids[:k], ids[k:k + 4], 5)
        times.append((time.perf_counter() - began) / 5 * 1e3)
    return statistics.median(times), max(times)


def run_constrained(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = [p["prompt"] for p in load_prompts(args.prompts, args.limit_prompts)]
    rows, outputs = [], {}
    with EmbeddedStack(stack_options(args)) as stack:
        _, target_info = service_infos(stack)
        warm_up(stack.endpoint, prompts[0], args.gamma_max)
        for name, gamma, constrained in (("target-only", 0, False), ("adaptive", None, False),
                                         ("target-only, JSON schema", 0, True), ("adaptive, JSON schema", None, True)):
            tokens, seconds, texts = 0, 0.0, []
            for prompt in prompts:
                request = make_request(prompt=prompt, max_new_tokens=args.max_new_tokens, gamma=gamma)
                if constrained:
                    request.constraint.json_schema = json.dumps(SCHEMA)
                began = time.perf_counter()
                result = generate(stack.endpoint, request, timeout=600)
                seconds += time.perf_counter() - began
                tokens += len(result.token_ids)
                texts.append(result.text)
            outputs[name] = texts
            rows.append({"config": name, "tokens_per_s": round(tokens / seconds, 2),
                         "valid": sum(map(follows_schema, texts)) if constrained else None})
    median, worst = mask_ms(weights.resolve(args.target_model), target_info.vocab_size)
    for row in rows:
        print(f"{row['config']:>26}: {row['tokens_per_s']:7.2f} tok/s"
              + (f", {row['valid']}/{len(prompts)} follow the schema" if row["valid"] is not None else ""))
    same = outputs["adaptive, JSON schema"] == outputs["target-only, JSON schema"]
    print(f"constrained adaptive ×{rows[3]['tokens_per_s'] / rows[2]['tokens_per_s']:.2f} constrained target-only; "
          f"answers identical: {same}; mask per verified row: {median:.2f} ms median, {worst:.2f} ms max "
          f"(vocabulary {target_info.vocab_size}, {target_info.hardware})")
    Path(args.output).write_text(json.dumps({"hardware": target_info.hardware, "path": target_info.compute_path,
                                             "rows": rows, "identical": same, "mask_ms_median": median,
                                             "mask_ms_max": worst, "outputs": outputs}, indent=2))
    print(f"wrote {args.output}")
    return 0
