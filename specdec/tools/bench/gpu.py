"""`specdec bench --gpu`: the GPU path in one command, on a host that can download nothing.

On the synthetic pair by default (`specdec.engine.synthetic`: the packaged pair's shapes, random
weights, the draft's greedy agreement set by eps), all in one run on one device, each part written to
--output as it ends (a run cut short keeps what it measured):
1. each model's step curve on the static runner (CUDA graphs) for S = 1..γ_max+1 and shared passes, its
   layers eager and compiled (SPECDEC_STATIC_COMPILE), the ragged runner's one-token step beside them, and
   the floor: weight bytes ÷ measured bandwidth (`--gpu-steps`: only this);
2. teacher-forced greedy agreement of the draft with the target;
3. through the services, on the faster of the two curves unless SPECDEC_STATIC_COMPILE says which:
   target-only, fixed γ and adaptive, one user, with α, accepted length, c, per-round overhead and
   identity with target-only, and the lookup proposers (n-gram, hybrid), whose drafts cost no device time;
   then 8 users at once, target-only and adaptive;
4. Hugging Face `generate` on the target, eager and with a static cache compiled (CUDA graphs), each
   prompt warmed once so that compilation is not timed, with the token where each prompt's greedy output
   first leaves ours (its kernels differ: a late, rare departure is rounding, an early one a different model);
   last, since compiling it takes the longest.
`--gpu-services` runs part 3 alone, `--gpu-hf` then the compiled part of 4.
`--device cpu` runs the same parts on the CPU (a dry run of the command; tests/test_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from specdec.engine.cpu.features import cpuinfo
from specdec.engine.measure import PassTimer, release_memory, synchronize
from specdec.engine.models import load_hf_model, load_model
from specdec.engine.runner import Step
from specdec.planning.cost import batch_sizes
from specdec.tools.bench.concurrency import run_level
from specdec.tools.bench.speed import load_prompts, print_table, run_configs, service_infos, summarise, warm_up

log = logging.getLogger(__name__)

SYNTHETIC_DRAFT, SYNTHETIC_TARGET = "synthetic:draft", "synthetic:target"
COMPILE_ENV = "SPECDEC_STATIC_COMPILE"  # read by `specdec.engine.static.runner.StaticRunner`
LOOKUP_PROPOSERS = ("ngram", "hybrid")  # with adaptive γ, beside the model draft's configs


def bandwidth_bytes_per_s(device: torch.device, size: int = 2**30) -> float:
    """Device memory bandwidth from a large copy (bytes read plus bytes written, per second)."""
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    began = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    synchronize(device)
    return 2 * 10 * size / (time.perf_counter() - began)


def time_forward(runner, sizes: list[int], rows: int, repeats: int = 20) -> list[float]:
    """Median seconds of one pass of each size (`specdec.engine.measure.PassTimer`: after a
    PROFILE_CONTEXT prefix, sessions of at most `rows` tokens)."""
    timer = PassTimer(runner, rows, max(sizes))
    return [statistics.median(timer.seconds(size) for _ in range(repeats)) for size in sizes]


def static_curve(spec: str, device: torch.device, dtype: str, sizes: list[int], rows: int,
                 compiled: bool) -> tuple[list[float], float, int]:
    """The static runner's step curve (seconds per size), its start-up seconds (load, capture and, compiled,
    compilation) and its weight bytes. `compiled`: its layers through torch.compile (SPECDEC_STATIC_COMPILE)."""
    with mock.patch.dict(os.environ, {COMPILE_ENV: "1" if compiled else "0"}):
        began = time.perf_counter()
        static = load_model(spec, device.type, dtype, runner="static", slots=8, max_tokens=rows).runner
        start_s = time.perf_counter() - began
    curve = time_forward(static, sizes, rows)
    weight_bytes = static.weight_bytes()
    del static
    release_memory(device)
    return curve, start_s, weight_bytes


def step_curves(args, device: torch.device, rows: int) -> dict:
    """Each model's static runner step curve, eager and compiled, the ragged runner's one-token step, and the
    floor: weight bytes ÷ measured bandwidth."""
    bandwidth = bandwidth_bytes_per_s(device)
    sizes = batch_sizes(rows, 8 * rows)
    curves = {"bandwidth_GBps": round(bandwidth / 1e9, 1), "sizes": sizes}
    for role, spec in (("target", args.target_model), ("draft", args.draft_model)):  # the target's matters most
        curve, start_s, weight_bytes = static_curve(spec, device, args.dtype, sizes, rows, compiled=False)
        floor = weight_bytes / bandwidth
        ragged = load_model(spec, device.type, args.dtype, runner="ragged", max_tokens=rows).runner
        ragged_step = time_forward(ragged, [1], rows)[0]
        del ragged
        release_memory(device)
        curves[role] = {"static_ms": [round(1e3 * s, 3) for s in curve], "ragged_step_ms": round(1e3 * ragged_step, 3),
                        "floor_ms": round(1e3 * floor, 3), "static_start_s": round(start_s, 1)}
        print(f"{role}: floor {1e3 * floor:.2f} ms; ragged runner S=1 {1e3 * ragged_step:.2f} ms; static runner "
              f"(start {start_s:.0f} s) {_curve_text(sizes, curve)}", flush=True)
        try:
            curve, start_s, _ = static_curve(spec, device, args.dtype, sizes, rows, compiled=True)
        except Exception as error:  # a compiler's failure leaves the eager runner to measure the rest with
            log.exception("%s: the compiled layers failed", role)
            curves[role]["static_compiled_error"] = repr(error)[:500]
            release_memory(device)
            continue
        curves[role].update(static_compiled_ms=[round(1e3 * s, 3) for s in curve],
                            static_compiled_start_s=round(start_s, 1))
        print(f"{role}: static runner compiled (start {start_s:.0f} s) {_curve_text(sizes, curve)}", flush=True)
    return curves


def compiled_is_faster(curves: dict) -> bool:
    """Whether the compiled layers make the target's and the draft's steps faster, summed over the curve."""
    return all("static_compiled_ms" in curve and sum(curve["static_compiled_ms"]) < sum(curve["static_ms"])
               for curve in (curves["target"], curves["draft"]))


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first position where two token lists differ (one ending early counts), None if they are equal."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _curve_text(sizes: list[int], seconds: list[float]) -> str:
    return ", ".join(f"S={s} {1e3 * t:.2f} ms" for s, t in zip(sizes, seconds))


def _write(payload: dict, path: str) -> None:
    Path(path).write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")


@torch.inference_mode()
def agreement(args, device: torch.device, prompts: list[str], n: int) -> float:
    """Teacher-forced greedy agreement: the share of the target's greedy tokens the draft also picks."""
    from specdec.weights.sources import load_tokenizer

    tokenizer = load_tokenizer(args.target_model)
    target = load_model(args.target_model, device.type, args.dtype, runner="static", slots=2).runner
    draft = load_model(args.draft_model, device.type, args.dtype, runner="static", slots=2).runner
    same = total = 0
    for prompt in prompts:
        ids = tokenizer(prompt).input_ids
        t_cache, d_cache = target.new_cache(), draft.new_cache()
        t_logits, d_logits = target.forward([Step(t_cache, ids)])[0], draft.forward([Step(d_cache, ids)])[0]
        for _ in range(n):
            token = int(t_logits[-1].argmax())
            same += int(d_logits[-1].argmax()) == token
            total += 1
            t_logits, d_logits = target.forward([Step(t_cache, [token])])[0], draft.forward([Step(d_cache, [token])])[0]
    del target, draft
    release_memory(device)
    return same / total


def hf_generate(args, device: torch.device, prompts: list[str], n: int, compiled: bool) -> dict:
    """Hugging Face `generate` on the target in bf16. compiled: a static cache, with which `generate` compiles
    its decoding step itself (torch.compile, mode "reduce-overhead": CUDA graphs) on CUDA. Compiling
    `model.forward` by hand as well, as older recipes did, broke on an H200 (a CUDA graph's output read after
    its next replay)."""
    from specdec.weights.sources import load_tokenizer

    tokenizer = load_tokenizer(args.target_model)
    model = load_hf_model(args.target_model, device, torch.bfloat16)
    kwargs = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    if compiled:
        model.generation_config.cache_implementation = "static"
    tokens = seconds = 0.0
    outputs = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        with torch.inference_mode():
            model.generate(ids, **kwargs)  # warm: compiles for this prompt length
            synchronize(device)
            began = time.perf_counter()
            out = model.generate(ids, **kwargs)
            synchronize(device)
        seconds += time.perf_counter() - began
        tokens += out.shape[1] - ids.shape[1]
        outputs.append(out[0, ids.shape[1]:].tolist())
        print(f"  {'compiled' if compiled else 'eager'} HF generate, prompt {len(outputs)}: "
              f"{tokens / seconds:.1f} tok/s so far", flush=True)
    result = {"tokens_per_s": round(tokens / seconds, 2), "outputs": outputs}
    if compiled:
        result["compiled"] = hasattr(model, "_compiled_call")  # what generate compiled, if it did (CUDA only)
    del model
    release_memory(device)
    return result


def run_gpu_bench(args: argparse.Namespace) -> int:
    from orchestrator.clients import target_client
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    if args.draft_model.startswith("packaged:") and args.target_model.startswith("packaged:"):
        args.draft_model, args.target_model = SYNTHETIC_DRAFT, SYNTHETIC_TARGET
    args.device = "cuda" if args.device == "auto" else args.device
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: bench --gpu needs CUDA, and torch sees no GPU here; --device cpu dry-runs it", file=sys.stderr)
        return 2
    chosen = load_prompts(args.prompts, args.limit_prompts or 3)
    prompts = [p["prompt"] for p in chosen]
    gammas = args.gammas
    gamma_max = max([args.gamma_max, *gammas])
    n = args.max_new_tokens
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({cpuinfo('model name')})"
    payload: dict = {"device": name, "draft": args.draft_model, "target": args.target_model,
                     "prompts": len(prompts), "max_new_tokens": n}
    began = time.perf_counter()

    def done(part: str) -> None:
        payload.setdefault("part_seconds", {})[part] = round(time.perf_counter() - began, 1)
        _write(payload, args.output)
        print(f"[{part} done at {time.perf_counter() - began:.0f} s]", flush=True)

    if not args.gpu_services:
        payload["step_curves"] = curves = step_curves(args, device, gamma_max + 1)
        done("step curves")
        if args.gpu_steps:
            return 0
        payload["greedy_agreement"] = round(agreement(args, device, prompts, n), 3)
        print(f"teacher-forced greedy agreement of the draft: {payload['greedy_agreement']}", flush=True)
    if COMPILE_ENV in os.environ:
        compiled = os.environ[COMPILE_ENV] == "1"
    else:  # by the curves; with --gpu-services, the services' default on CUDA
        compiled = device.type == "cuda" if args.gpu_services else compiled_is_faster(curves)
    payload["services_compiled"] = compiled
    print(f"the services run the static runner with its layers {'compiled' if compiled else 'eager'}", flush=True)
    with mock.patch.dict(os.environ, {COMPILE_ENV: "1" if compiled else "0"}), \
            EmbeddedStack(stack_options(args, gamma_max=gamma_max, max_sessions=16)) as stack:
        draft_info, target_info = service_infos(stack)
        warm_up(stack.endpoint, prompts[0], gamma_max)
        configs = [("target-only", 0), *[(f"γ={g}", g) for g in gammas], ("adaptive", None),
                   *[(proposer, None, {"proposer": proposer}) for proposer in LOOKUP_PROPOSERS]]
        results = run_configs(stack.endpoint, configs, chosen, n)
        adaptive = next(r for r in results if r.name == "adaptive")
        rows = summarise(results, None, draft_info, target_info)
        print_table(rows)
        payload.update(rows=rows, target_kernel=target_info.kernel,
                       adaptive_gammas=[r.gamma for r in adaptive.rounds])
        done("one user")
        users = [prompts[i % len(prompts)] for i in range(8)]
        target = target_client(stack.target_address)  # its pass counters: sessions per forward pass
        levels = {label: run_level(stack.endpoint, users, n, gamma, target)
                  for label, gamma in (("target-only", 0), ("adaptive", None))}
    base = results[0]
    eight = [level.row(label, len(users)) for label, level in levels.items()]
    for row in eight:
        print(f"8 users, {row['config']}: {row['tokens_per_s']:.1f} tok/s aggregate "
              f"(×{row['tokens_per_s'] / base.tokens_per_s:.2f} one user's target-only); sessions per target "
              f"pass {row['target_rows_per_pass']}, TTFT {row['ttft_s']} s, ITL p50 {row['itl_p50_ms']} ms; a round "
              f"{row['round_ms']} ms: target forward {row['target_forward_ms']} ms, waiting for its pass "
              f"{row['target_wait_ms']} ms")
    payload["eight_users"] = {k: round(v.tokens / v.seconds, 2) for k, v in levels.items()}
    payload["eight_user_rows"] = eight
    done("8 users")
    if args.gpu_services:  # the compiled reference alone, if asked
        hf_runs = [("hf-static-compiled", True)] if args.gpu_hf else []
    else:
        hf_runs = [("hf-eager", False)] + ([] if args.no_hf_compiled else [("hf-static-compiled", True)])
    for label, compile_hf in hf_runs:
        result = hf_generate(args, device, prompts, n, compiled=compile_hf)
        rate = result["tokens_per_s"]
        departures = [first_difference(ours, theirs) for ours, theirs in zip(base.outputs, result["outputs"])]
        print(f"{label}: {rate} tok/s; ours target-only ×{base.tokens_per_s / rate:.2f}, "
              f"adaptive ×{adaptive.tokens_per_s / rate:.2f}; greedy output first leaves ours at token "
              f"{departures} of {n} (None: identical)", flush=True)
        payload.setdefault("hf", {})[label] = rate
        payload.setdefault("hf_first_difference", {})[label] = departures
        if compile_hf and not result["compiled"]:
            print(f"{label}: generate did not compile its step here (it does on CUDA)", flush=True)
            payload["hf_static_not_compiled"] = True
        done(label)
    return 0
