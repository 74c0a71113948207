"""`specdec bench --workloads editing,code,prose`: each proposer on each kind of work.

Editing (the prompt holds code, the answer rewrites it with a small change), fresh code and prose,
as chat requests through the model's template, greedy. Per prompt, in turn: target-only, the draft
model, prompt lookup, hybrid, hybrid with drafting during verification (overlap on), hybrid with the
client's predicted output where the workload has one (editing: the file it edits, `predicted_output`), and
Hugging Face's prompt-lookup decoding (`prompt_lookup_num_tokens`)
in this process on the same kernels, the n-gram peer. It prints tok/s, α, mean accepted length, the
draft model's c, the share of speculative rounds each proposer drafted and the overlap hit rate, per
workload, and a PNG.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from importlib import resources
from pathlib import Path

from tqdm import tqdm

from specdec import weights
from specdec.cli.client import generate, make_request
from specdec.engine.measure import off_the_initial_thread
from specdec.tools.bench.baseline import greedy_generate, hf_baseline
from specdec.tools.bench.speed import ConfigResult, save_rows, service_infos, warm_up

CONFIGS = (("target-only", 0, "model", "off"), ("model", None, "model", "off"), ("ngram", None, "ngram", "off"),
           ("hybrid", None, "hybrid", "off"), ("hybrid+overlap", None, "hybrid", "on"))
PREDICTED = ("hybrid+prediction", None, "hybrid", "off")  # where a conversation has a predicted output
FENCED = re.compile(r"```[^\n]*\n.*?```", re.DOTALL)
HF_LOOKUP_TOKENS = 10  # Hugging Face's documented example value


class HFPromptLookup:
    """Hugging Face generate(prompt_lookup_num_tokens=...) on the target, same kernels, this process."""

    name = "hf-prompt-lookup"

    def __init__(self, args: argparse.Namespace, path: str, kernel: str):
        from specdec.engine.models import resolve_device

        self.device = resolve_device(args.device)
        self.target = hf_baseline(args.target_model, self.device, path, kernel)

    def __call__(self, ids: list[int], n: int, pad: int) -> list[int]:
        import torch

        prompt = torch.tensor([ids], device=self.device)
        out = off_the_initial_thread(greedy_generate, self.target, prompt, prompt_lookup_num_tokens=HF_LOOKUP_TOKENS,
                                     max_new_tokens=n, pad_token_id=pad)
        return out[0, len(ids):].tolist()


def load_workloads(names: list[str]) -> dict[str, list[list[dict]]]:
    every = json.loads(resources.files("specdec.tools.bench").joinpath("workloads.json").read_text())
    unknown = set(names) - set(every)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; known: {sorted(every)}")
    return {name: [p["messages"] for p in every[name]] for name in names}


def predicted_output(messages: list[dict]) -> str | None:
    """What an editing request's answer is expected to repeat, as its client would predict it (OpenAI's Predicted
    Outputs): the last fenced code block of the last message, fences included; None without one."""
    blocks = FENCED.findall(messages[-1]["content"])
    return blocks[-1] if blocks else None


def summary(result: ConfigResult, workload: str, baseline_tps: float) -> dict:
    drafted = [r for r in result.rounds if r.drafted]
    by = {source: sum(1 for r in drafted if r.proposer == source) for source in ("model", "ngram")}
    c = [r.cost_ratio_estimate for r in drafted if r.proposer == "model"]
    return {"workload": workload, "config": result.name, "tokens_per_s": round(result.tokens_per_s, 3),
            "speedup": round(result.tokens_per_s / baseline_tps, 3) if baseline_tps else None,
            "alpha": None if result.alpha() is None else round(result.alpha(), 3),
            "mean_accepted_length": None if result.mean_accepted_length() is None
            else round(result.mean_accepted_length(), 3),
            "c": round(statistics.mean(c), 3) if c else None,
            "lookup_share": round(by["ngram"] / len(drafted), 3) if drafted else None,
            "overlap_hit_rate": None if result.hit_rate() is None else round(result.hit_rate(), 3)}


def run_workloads(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack
    from specdec.weights.sources import load_tokenizer

    workloads = load_workloads([w for w in args.workloads.split(",") if w])
    tokenizer = load_tokenizer(weights.resolve(args.target_model))
    rows: list[dict] = []
    with EmbeddedStack(stack_options(args)) as stack:
        _, target_info = service_infos(stack)
        peer = None if args.no_hf else HFPromptLookup(args, target_info.compute_path, target_info.kernel)
        warm_up(stack.endpoint, "def fib(n):", args.gamma_max)
        for workload, conversations in workloads.items():
            predictions = [predicted_output(messages) for messages in conversations]
            configs = CONFIGS + ((PREDICTED,) if all(predictions) else ())
            results = [ConfigResult(name, gamma) for name, gamma, *_ in configs]
            peer_result = ConfigResult(HFPromptLookup.name, None)
            for messages, prediction in tqdm(list(zip(conversations, predictions)), desc=workload):
                ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
                for config, result in zip(configs, results):
                    _, gamma, proposer, overlap = config
                    request = make_request(prompt_token_ids=ids, max_new_tokens=args.max_new_tokens, gamma=gamma,
                                           proposer=proposer, overlap=overlap)
                    if config is PREDICTED:
                        request.prediction = prediction
                    result.add(lambda: generate(stack.endpoint, request))
                if peer is not None:
                    peer_result.add(lambda: peer(ids, args.max_new_tokens, tokenizer.eos_token_id))
            baseline = results[0]
            for result in results + ([peer_result] if peer is not None else []):
                rows.append(summary(result, workload, baseline.tokens_per_s))
                rows[-1]["same_as_target_only"] = all(a[:len(b)] == b[:len(a)] for a, b in
                                                      zip(result.outputs, baseline.outputs))
    print(f"machine: {target_info.hardware}; path {target_info.compute_path} ({target_info.kernel}); "
          f"{args.max_new_tokens} tokens per prompt, greedy, configs interleaved per prompt")
    print("workload | config | tok/s | × target-only | α | accepted length | c | lookup share | overlap hits "
          "| = target-only")
    for r in rows:
        print(" | ".join(str(r[k]) for k in ("workload", "config", "tokens_per_s", "speedup", "alpha",
                                             "mean_accepted_length", "c", "lookup_share", "overlap_hit_rate",
                                             "same_as_target_only")))
    save_rows(args.output, target_info, args.max_new_tokens, rows, plot)
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    width = 0.8 / len(configs)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, config in enumerate(configs):
        values = [next((r["speedup"] for r in rows if r["workload"] == w and r["config"] == config), 0) for w in
                  workloads]
        ax.bar([x + i * width for x in range(len(workloads))], values, width, label=config)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(workloads))], workloads)
    ax.set(ylabel="tokens/s × target-only", title="proposers per workload (greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
