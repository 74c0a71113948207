"""`specdec bench --depths 0,1024,3072,6144`: the target at depth, an agent's regime. After d tokens of context,
one token's step (median of `STEPS`) and a `CHUNK`-token prompt chunk (best of `CHUNKS`), as tokens/s, on the
target's path (`--dtype`, default as served; on CUDA the static runner, its graphs replayed, each pass timed
to its last kernel), with llama.cpp's own figures beside when given:
`llama-bench -m <the same GGUF> -t 2 -p 256 -n 16 -d 0,1024,3072,6144 -o json > llama.json`, passed with
`--llama-bench llama.json` (its tg rows are its decode, its pp rows its chunk). Every other benchmark feeds prompts
of tens of tokens, where attention is a few percent of a step. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec import weights
from specdec.engine.measure import off_the_initial_thread, synchronize
from specdec.engine.model_engine import PREFILL_CHUNK as CHUNK  # a prompt's chunk alone
from specdec.engine.models import load_model
from specdec.engine.runner import Step

STEPS, CHUNKS = 8, 2


def llama_at_depth(path: str) -> dict[int, dict[str, float]]:
    """{depth: {"decode": tok/s, "chunk": tok/s}} from `llama-bench -o json` rows that carry n_depth."""
    if not path:
        return {}
    rows: dict[int, dict[str, float]] = {}
    for r in json.loads(Path(path).read_text()):
        kind = "decode" if r["n_gen"] > 0 else "chunk"
        rows.setdefault(r.get("n_depth", 0), {})[kind] = r["avg_ts"]
    return rows


def context_tokens(vocab: int, count: int) -> list[int]:
    """`count` random token ids below `vocab`, the same every run: a context to fill caches with."""
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(0)).tolist()


def fill_to(runner, cache, tokens: list[int], depth: int) -> None:
    """Feed `cache` tokens[cache.length:depth] in prompt chunks of CHUNK, as a long prompt goes in."""
    while cache.length < depth:
        n = min(CHUNK, depth - cache.length)
        runner.forward([Step(cache, tokens[cache.length:cache.length + n], logits=1)])


def measure_depths(runner, depths: list[int], vocab: int) -> list[dict]:
    """Per depth (ascending): the decode step's and the chunk's tokens/s, after that many random tokens."""
    tokens = context_tokens(vocab, max(depths) + CHUNK)
    cache, rows = runner.new_cache(), []
    for depth in sorted(depths):
        fill_to(runner, cache, tokens, depth)
        steps, chunks = [], []
        for size, times, count in ((1, steps, STEPS), (CHUNK, chunks, CHUNKS)):
            for _ in range(count):
                synchronize(runner.device)  # the fill's queued kernels are not this pass's
                began = time.perf_counter()
                runner.forward([Step(cache, tokens[depth:depth + size], logits=1)])
                synchronize(runner.device)  # a GPU's pass is done when its kernels are, not when it returns
                times.append(time.perf_counter() - began)
                cache.crop(depth)
        rows.append({"depth": depth, "decode_tok_s": round(1 / statistics.median(steps), 2),
                     "chunk_tok_s": round(CHUNK / min(chunks), 1)})
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    depths = [r["depth"] for r in result["rows"]]
    for ax, key, title in ((axes[0], "decode", "one token's step"), (axes[1], "chunk", f"a {CHUNK}-token chunk")):
        ax.plot(depths, [r[f"{key}_tok_s"] for r in result["rows"]], "o-", label=f"specdec {result['path']}")
        llama = [(r["depth"], r[f"llama_{key}_tok_s"]) for r in result["rows"] if f"llama_{key}_tok_s" in r]
        if llama:
            ax.plot(*zip(*llama), "s--", label="llama.cpp (llama-bench -d)")
        ax.set_xlabel("tokens of context before it")
        ax.set_ylabel("tokens/s")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"The target at depth\n{result['hardware']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_depths(args: argparse.Namespace) -> int:
    from specdec.engine.cpu.features import cpu_features

    depths = sorted({int(d) for d in args.depths.split(",") if d})
    loaded = load_model(weights.resolve(args.target_model), args.device, dtype=args.dtype)
    rows = off_the_initial_thread(measure_depths, loaded.runner, depths, loaded.vocab_size)
    llama = llama_at_depth(args.llama_bench)
    for row in rows:
        for kind, rate in llama.get(row["depth"], {}).items():
            row[f"llama_{kind}_tok_s"] = round(rate, 2)
    result = {"hardware": cpu_features().describe(), "threads": torch.get_num_threads(),
              "path": loaded.choice.path, "kernel": loaded.choice.kernel, "chunk": CHUNK, "rows": rows}
    print(f"machine: {result['hardware']}, {result['threads']} threads; target on {result['path']} "
          f"({result['kernel']}); tokens/s")
    print(f"  depth | decode | llama.cpp decode | {CHUNK}-token chunk | llama.cpp chunk")
    for r in rows:
        print(f"{r['depth']:7d} | {r['decode_tok_s']:6.1f} | {r.get('llama_decode_tok_s', float('nan')):16.1f} | "
              f"{r['chunk_tok_s']:16.1f} | {r.get('llama_chunk_tok_s', float('nan')):15.1f}")
    output = Path(args.output)
    output.write_text(json.dumps(result, indent=2))
    plot(result, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0
