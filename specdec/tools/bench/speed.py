"""`specdec bench`: target-only vs fixed-γ and adaptive speculation vs Hugging Face assisted generation.

Everything runs in one process tree and one run, on the same prompts and models, greedy, on one
compute path; the Hugging Face baseline gets the same linear kernels (`specdec.tools.bench.baseline`).
It prints the machine, the path, both models' cost profiles (forward time against tokens per
forward), and for each γ the speed-up Theorem 3.8 predicts (verify = one step) and the one the
measured profiles predict, beside the measured one.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from tqdm import tqdm

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec import weights
from specdec.cli.client import generate, make_request
from specdec.core.rounds import AcceptanceEstimate, overhead_s
from specdec.runtime.server import CHANNEL_OPTIONS
from specdec.runtime.wire import cost_profile_from_pb
from specdec.engine.measure import off_the_initial_thread
from specdec.tools.bench.baseline import greedy_generate, hf_baseline
from specdec.tools.bench.theory import profile_speedup, theorem_speedup
from specdec.tools.bench.tracing import tracing_cost_us


@dataclass
class ConfigResult:
    name: str
    gamma: int | None
    tokens: int = 0
    seconds: float = 0.0
    rounds: list = field(default_factory=list)  # pb.RoundStats of every run
    outputs: list[list[int]] = field(default_factory=list)
    branches: int = 0  # next rounds drafted during a verify (overlap), and of those …
    hits: int = 0  # … the ones the verdict matched

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def spec_rounds(self):
        return [r for r in self.rounds if r.drafted > 0]

    def alpha(self) -> float | None:
        estimate = AcceptanceEstimate.from_rounds(self.rounds)
        return estimate.alpha if estimate else None

    def mean_accepted_length(self) -> float | None:
        spec = self.spec_rounds()
        return sum(r.emitted for r in spec) / len(spec) if spec else None

    def draft_step_s(self) -> float | None:
        spec = self.spec_rounds()
        return sum(r.draft_compute_s for r in spec) / sum(r.drafted for r in spec) if spec else None

    def add(self, run) -> None:
        """Time one generation, `run()` -> a GenerateResult, or a list of token ids (an in-process peer)."""
        began = time.perf_counter()
        out = run()
        self.seconds += time.perf_counter() - began
        tokens = out if isinstance(out, list) else out.token_ids
        self.tokens += len(tokens)
        self.outputs.append(tokens)
        if not isinstance(out, list):
            self.rounds.extend(out.rounds)
            self.branches += out.stats.get("overlap_branches", 0)
            self.hits += out.stats.get("overlap_hits", 0)

    def hit_rate(self) -> float | None:
        return self.hits / self.branches if self.branches else None

    def overhead_ms(self) -> float:
        return 1e3 * sum(overhead_s(r) for r in self.rounds) / len(self.rounds)

    def target_split_ms(self) -> tuple[float, float]:
        """Per round: the target's forward passes, and its wait for them to begin (ms, rounded)."""
        n = len(self.rounds)
        return (round(1e3 * sum(r.target_forward_s for r in self.rounds) / n, 2),
                round(1e3 * sum(r.target_wait_s for r in self.rounds) / n, 2))


def load_prompts(path: str, limit: int) -> list[dict]:
    text = Path(path).read_text() if path else resources.files("specdec.tools.bench").joinpath("prompts.json").read_text()
    prompts = json.loads(text)
    return prompts[:limit] if limit else prompts


class HFAssisted:
    """Hugging Face generate(assistant_model=...) in this process, on the same two models and kernels.

    A callable prompt -> generated ids, so the benchmark can interleave it with the other configs.
    """

    name = "hf-assisted"

    def __init__(self, args: argparse.Namespace, path: str, kernel: str):
        from specdec.engine.models import resolve_device
        from specdec.weights.sources import load_tokenizer

        self.tokenizer = load_tokenizer(weights.resolve(args.target_model))
        self.device = resolve_device(args.device)
        self.target = hf_baseline(args.target_model, self.device, path, kernel)
        self.draft = hf_baseline(args.draft_model, self.device, path, kernel)

    def __call__(self, prompt: str, n: int) -> list[int]:
        ids = self.tokenizer(prompt, return_tensors="pt").input_ids.to(self.device)
        out = off_the_initial_thread(greedy_generate, self.target, ids, assistant_model=self.draft, max_new_tokens=n,
                                     pad_token_id=self.tokenizer.eos_token_id)
        return out[0, ids.shape[1]:].tolist()


def service_infos(stack) -> tuple[pb.ModelInfo, pb.ModelInfo]:
    """(draft, target) ModelInfo: compute path, hardware and cost profiles."""
    import grpc

    infos = []
    for address, stub in ((stack.draft_address, pb_grpc.DraftServiceStub),
                          (stack.target_address, pb_grpc.TargetServiceStub)):
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            infos.append(stub(channel).Info(pb.ModelInfoRequest(), timeout=60))
    return infos[0], infos[1]


def print_setup(draft: pb.ModelInfo, target: pb.ModelInfo) -> None:
    print(f"machine: {target.hardware}")
    for role, info in (("draft", draft), ("target", target)):
        print(f"{role}: {info.model} on path {info.compute_path} (kernel {info.kernel}, "
              f"row-invariant {info.row_invariant})")
    print("cost profile: one forward of S new tokens after a 128-token context, ms (and × S=1)")
    profiles = [cost_profile_from_pb(draft), cost_profile_from_pb(target)]
    print(" S | " + " | ".join(f"{role:>16}" for role in ("draft", "target")))
    for size in range(1, len(profiles[1].seconds) + 1):
        print(f"{size:2d} | " + " | ".join(f"{p.forward_s(size) * 1e3:8.1f} ({p.ratio(size):4.2f}x)" for p in profiles))


def run_configs(endpoint: str, configs: list[tuple], prompts: list[dict], n: int,
                desc: str = "prompts", peer: HFAssisted | None = None) -> list[ConfigResult]:
    """Every config on every prompt, round-robin per prompt so slow drift hits all configs alike.

    A config: (name, γ), or (name, γ, {"proposer": …, "overlap": …}) for `make_request`. `peer` (an
    in-process baseline) takes its turn in the same round-robin; its result comes last.
    """
    results = [ConfigResult(name, gamma) for name, gamma, *_ in configs]
    choices = [config[2] if len(config) > 2 else {} for config in configs]
    peer_result = ConfigResult(peer.name, None) if peer is not None else None
    for p in tqdm(prompts, desc=desc):
        for res, chosen in zip(results, choices):
            res.add(lambda: generate(endpoint, make_request(prompt=p["prompt"], max_new_tokens=n, gamma=res.gamma,
                                                            **chosen)))
        if peer is not None:
            peer_result.add(lambda: peer(p["prompt"], n))
    return results + ([peer_result] if peer_result is not None else [])


def save_rows(path: str, info: pb.ModelInfo, max_new_tokens: int, rows: list[dict], plot=None) -> None:
    """A sweep's rows as JSON with the machine and path they were measured on; `plot(rows, png)` beside it."""
    output = Path(path)
    output.write_text(json.dumps({"hardware": info.hardware, "path": info.compute_path,
                                  "max_new_tokens": max_new_tokens, "rows": rows}, indent=2))
    if plot is not None:
        plot(rows, output.with_suffix(".png"))
    print(f"wrote {output}" + (f" and {output.with_suffix('.png')}" if plot is not None else ""))


def warm_up(endpoint: str, prompt: str, gamma_max: int, max_runs: int = 15, tolerance: float = 0.03) -> float:
    """Run until the target's step time settles; returns it in seconds.

    The first minute or two after load is up to 1.7x slower on CPU (pages of the freshly copied
    weights settling), which would bias whichever config ran first.
    """
    generate(endpoint, make_request(prompt=prompt, max_new_tokens=8, gamma=min(3, gamma_max)))  # the draft too
    previous = None
    for _ in tqdm(range(max_runs), desc="warm-up", leave=False):
        out = generate(endpoint, make_request(prompt=prompt, max_new_tokens=12, gamma=0))
        steps = sorted(r.target_compute_s for r in out.rounds[1:])
        step = steps[len(steps) // 2]
        if previous is not None and abs(step - previous) <= tolerance * previous:
            break
        previous = step
    return step


def summarise(results: list[ConfigResult], hf: ConfigResult | None, draft_info: pb.ModelInfo,
              target_info: pb.ModelInfo) -> list[dict]:
    base = results[0]  # γ = 0
    draft_profile, target_profile = cost_profile_from_pb(draft_info), cost_profile_from_pb(target_info)
    target_step = sum(r.target_compute_s for r in base.rounds[1:]) / max(len(base.rounds) - 1, 1)
    rows = []
    for res in [*results, *([hf] if hf else [])]:
        alpha, step = res.alpha(), res.draft_step_s()
        c = step / target_step if step else None
        known = res.gamma and alpha is not None and c
        predicted = theorem_speedup(alpha, res.gamma, c) if known else None
        measured_curve = profile_speedup(alpha, res.gamma, draft_profile, target_profile) if known else None
        forward, wait = res.target_split_ms() if res.rounds else (None, None)
        rows.append({
            "config": res.name, "tokens": res.tokens, "seconds": round(res.seconds, 2),
            "tokens_per_s": round(res.tokens_per_s, 3),
            "speedup_vs_target": round(res.tokens_per_s / base.tokens_per_s, 3),
            "speedup_vs_hf_assisted": round(res.tokens_per_s / hf.tokens_per_s, 3) if hf else None,
            "alpha": None if alpha is None else round(alpha, 3),
            "mean_accepted_length": None if res.mean_accepted_length() is None else round(res.mean_accepted_length(), 3),
            "c": None if c is None else round(c, 3),
            "predicted_speedup_thm38": None if predicted is None else round(predicted, 3),
            "predicted_speedup_profile": None if measured_curve is None else round(measured_curve, 3),
            "overhead_ms_per_round": round(res.overhead_ms(), 2) if res.rounds else None,
            "target_forward_ms_per_round": forward, "target_wait_ms_per_round": wait,
            "identical_to_target_only": res.outputs == base.outputs,
        })
    return rows


def print_table(rows: list[dict]) -> None:
    cols = ["config", "tokens_per_s", "speedup_vs_target", "speedup_vs_hf_assisted", "alpha", "mean_accepted_length",
            "c", "predicted_speedup_thm38", "predicted_speedup_profile", "overhead_ms_per_round",
            "target_forward_ms_per_round", "target_wait_ms_per_round", "identical_to_target_only"]
    heads = ["config", "tok/s", "vs target", "vs HF asst", "α", "mean acc len", "c", "Thm3.8 pred", "profile pred",
             "ovh ms/rnd", "fwd ms/rnd", "wait ms/rnd", "identical"]
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    table = [heads] + [[fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(heads))]
    for i, row in enumerate(table):
        print(" | ".join(cell.rjust(w) for cell, w in zip(row, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))


def run_bench(args: argparse.Namespace) -> int:
    if args.paths:
        from specdec.tools.bench.paths import run_path_sweep

        return run_path_sweep(args)
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    prompts = load_prompts(args.prompts, args.limit_prompts)
    gammas = args.gammas
    gamma_max = max([args.gamma_max, *gammas])
    with EmbeddedStack(stack_options(args, gamma_max=gamma_max)) as stack:
        draft_info, target_info = service_infos(stack)
        peer = None if args.no_hf else HFAssisted(args, target_info.compute_path, target_info.kernel)
        warm_up(stack.endpoint, prompts[0]["prompt"], gamma_max)
        if peer is not None:
            peer(prompts[0]["prompt"], 8)  # page its weights in
        configs = [("target-only", 0), *[(f"γ={g}", g) for g in gammas], ("adaptive", None)]
        results = run_configs(stack.endpoint, configs, prompts, args.max_new_tokens, peer=peer)
    hf = results.pop() if peer is not None else None
    rows = summarise(results, hf, draft_info, target_info)
    print_setup(draft_info, target_info)
    print_table(rows)
    if hf is not None:
        print(f"HF assisted output identical to target-only: {hf.outputs == results[0].outputs}")
    tracing_cost = tracing_cost_us()
    print(f"orchestrator call path per round: {tracing_cost['round_path_us_tracing_off']:.1f} µs with tracing off, "
          f"{tracing_cost['round_path_us_tracing_on']:.1f} µs with tracing on")
    payload = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "draft": args.draft_model,
               "target": args.target_model, "hardware": target_info.hardware, "path": target_info.compute_path,
               "kernel": target_info.kernel, "draft_profile_ms": [ns / 1e6 for ns in draft_info.forward_ns],
               "target_profile_ms": [ns / 1e6 for ns in target_info.forward_ns], "rows": rows,
               "adaptive_gammas": [r.gamma for r in results[-1].rounds], **tracing_cost}
    Path(args.output).write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.output}")
    return 0
