"""`specdec bench --paths fp32,gguf,bf16,int8`: target-only, adaptive speculation and HF assisted generation
on each compute path, side by side, with each lossy path's greedy agreement with fp32.

Every path gets its own stack (both models on that path) and its own HF baseline with the same
kernels, so each ratio compares like with like. Agreement is teacher-forced: along the fp32
target's greedy continuation of each prompt, how often the path's target predicts the same next
token. It writes JSON and a PNG of tokens/s per path.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from specdec import weights
from specdec.runtime.wire import cost_profile_from_pb
from specdec.tools.bench.speed import HFAssisted, load_prompts, run_configs, service_infos, warm_up

if TYPE_CHECKING:
    from protos import specdec_pb2 as pb

PATH_FLAGS = {"fp32": ("float32", "none"), "bf16": ("bfloat16", "none"), "fp16": ("float16", "none"),
              "int8": ("auto", "int8"), "gguf": ("gguf", "none"),
              "gguf-q8": ("gguf-q8", "none")}


def greedy(runner, prompt_ids: list[int], n: int) -> list[int]:
    from specdec.engine.runner import Step

    cache = runner.new_cache()
    logits = runner.forward([Step(cache, prompt_ids)])[0]
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = runner.forward([Step(cache, out[-1:])])[0]
    return out


def teacher_forced_agreement(args: argparse.Namespace, prompts: list[dict], paths: list[str],
                             fp32_outputs: list[list[int]] | None) -> dict[str, float]:
    """Per path: the share of positions along fp32's greedy continuations where the path's argmax agrees."""
    from specdec.engine.models import load_model
    from specdec.engine.runner import Step
    from specdec.weights.sources import load_tokenizer

    tokenizer = load_tokenizer(weights.resolve(args.target_model))
    prompt_ids = [tokenizer.encode(p["prompt"]) for p in prompts]  # as the server feeds them (a Llama's BOS)
    if fp32_outputs is None:
        reference = load_model(weights.resolve(args.target_model), args.device, "float32").runner
        fp32_outputs = [greedy(reference, ids, args.max_new_tokens) for ids in tqdm(prompt_ids, desc="fp32 greedy")]
        del reference
        gc.collect()
    agreement = {}
    for path in paths:
        if path == "fp32":
            agreement[path] = 1.0
            continue
        dtype, quantize = PATH_FLAGS[path]
        runner = load_model(weights.resolve(args.target_model), args.device, dtype, quantize).runner
        same = total = 0
        for ids, continuation in zip(prompt_ids, fp32_outputs):
            sequence = ids + continuation
            logits = runner.forward([Step(runner.new_cache(), sequence[:-1], logits=len(continuation))])[0]
            same += int((logits.argmax(-1) == torch.tensor(continuation)).sum())
            total += len(continuation)
        agreement[path] = same / total
        del runner
        gc.collect()
    return agreement


def memory_mib(draft: pb.ModelInfo, target: pb.ModelInfo) -> dict[str, int]:
    """Weights held and resident memory of each service (rank 0's, from `Info`), in MiB."""
    return {"target_weights_mib": round(target.ranks[0].parameter_bytes / 2**20),
            "target_rss_mib": round(target.ranks[0].resident_bytes / 2**20),
            "draft_rss_mib": round(draft.ranks[0].resident_bytes / 2**20)}


def plot(rows: list[dict], path: Path, hardware: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("target_only_tok_s", "target-only"), ("adaptive_tok_s", "adaptive speculation"),
              ("hf_assisted_tok_s", "HF assisted (same kernels)")]
    series = [(name, label) for name, label in series if any(row[name] for row in rows)]  # --no-hf: no HF bars
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(series)
    for i, (name, label) in enumerate(series):
        values = [row[name] or 0.0 for row in rows]
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=label)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(rows))],
                  [f"{r['path']}\n(agreement {r['agreement_with_fp32']:.2f})" for r in rows])
    ax.set_ylabel("tokens / s")
    ax.set_title(f"Throughput per compute path (one run)\n{hardware}" if hardware else
                 "Throughput per compute path (one run)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_path_sweep(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = load_prompts(args.prompts, args.limit_prompts)
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATH_FLAGS]
    if unknown:
        raise SystemExit(f"unknown path(s) {unknown}; choose from {sorted(PATH_FLAGS)}")
    rows, fp32_outputs, hardware = [], None, ""
    for path in paths:
        dtype, quantize = PATH_FLAGS[path]
        base = stack_options(args)
        with EmbeddedStack(dataclasses.replace(base, service=dataclasses.replace(base.service, dtype=dtype,
                                                                                 quantize=quantize))) as stack:
            draft_info, target_info = service_infos(stack)
            peer = None if args.no_hf else HFAssisted(args, path, target_info.kernel)
            warm_up(stack.endpoint, prompts[0]["prompt"], args.gamma_max)
            if peer is not None:
                peer(prompts[0]["prompt"], 8)  # page its weights in
            base, adaptive, *peer_result = run_configs(stack.endpoint, [("target-only", 0), ("adaptive", None)],
                                                       prompts, args.max_new_tokens, f"path {path}", peer)
            memory = memory_mib(*service_infos(stack))  # after the runs: resident as served
            del peer
            gc.collect()
        hf = peer_result[0] if peer_result else None
        if path == "fp32":
            fp32_outputs = base.outputs
        hardware = target_info.hardware
        target_profile, draft_profile = cost_profile_from_pb(target_info), cost_profile_from_pb(draft_info)
        rows.append({
            "path": path, "kernel": target_info.kernel, "row_invariant": target_info.row_invariant,
            "target_step_ms": round(target_profile.forward_s(1) * 1e3, 1),
            "target_s5_over_s1": round(target_profile.ratio(5), 2),
            "draft_step_ms": round(draft_profile.forward_s(1) * 1e3, 1),
            "target_only_tok_s": round(base.tokens_per_s, 3), "adaptive_tok_s": round(adaptive.tokens_per_s, 3),
            "adaptive_over_target_only": round(adaptive.tokens_per_s / base.tokens_per_s, 3),
            "hf_assisted_tok_s": round(hf.tokens_per_s, 3) if hf else None,
            "adaptive_over_hf_assisted": round(adaptive.tokens_per_s / hf.tokens_per_s, 3) if hf else None,
            "adaptive_identical_to_target_only": adaptive.outputs == base.outputs,
            "adaptive_alpha": None if adaptive.alpha() is None else round(adaptive.alpha(), 3),
            "adaptive_gammas": sorted({r.gamma for r in adaptive.rounds}),
            **memory,
        })
    agreement = teacher_forced_agreement(args, prompts, paths, fp32_outputs)
    for row in rows:
        row["agreement_with_fp32"] = round(agreement[row["path"]], 3)
    print(f"machine: {hardware}")
    columns = ["path", "kernel", "target_step_ms", "target_s5_over_s1", "draft_step_ms", "target_only_tok_s",
               "adaptive_tok_s", "adaptive_over_target_only", "hf_assisted_tok_s", "adaptive_over_hf_assisted",
               "agreement_with_fp32", "adaptive_identical_to_target_only", "target_weights_mib", "target_rss_mib",
               "draft_rss_mib"]
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    output = Path(args.output)
    output.write_text(json.dumps({"hardware": hardware, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                                  "rows": rows}, indent=2))
    plot(rows, output.with_suffix(".png"), hardware)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0
