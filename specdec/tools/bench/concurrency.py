"""`specdec bench --concurrency 1,4,8,16`: many users at once.

For each level N, N clients stream generations at the same time from one embedded stack, with
target-only and with adaptive speculation, and Hugging Face `generate` runs the same N prompts as
one padded batch in this process on the same kernels (the in-process peer, target only). It prints
aggregate tokens/s, time to first token and p50/p95 inter-token latency, and plots tok/s, TTFT and p95
latency against N. With `--repeats R`, each level's configs run R times in alternating order and
their runs are summed; each run's own tokens/s stays in its row (`run_tokens_per_s`), so that drift within a
sitting shows beside the ratio. Each run takes the next prompts of the set, so one user meets every prompt over
as many repeats. With `--peers NAME=URL,...`, OpenAI-compatible servers on the same model
(llama-server with `-np N`, say) are configs of each level too, their users streaming POST /v1/completions
(greedy, no kept prompt), and each of ours is printed over each peer.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from protos import specdec_pb2_grpc as pb_grpc
from specdec import weights
from specdec.cli.client import make_request
from specdec.runtime.security import open_channel
from specdec.runtime.server import CHANNEL_OPTIONS
from specdec.engine.measure import off_the_initial_thread
from specdec.tools.bench.baseline import greedy_generate, hf_baseline
from specdec.tools.bench.openai_stream import http_stream, served_model
from specdec.tools.bench.speed import load_prompts, save_rows, service_infos, warm_up


@dataclass
class Level:
    tokens: int = 0
    seconds: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)  # per token, between streamed chunks
    gammas: list[int] = field(default_factory=list)  # γ of every round
    # Per round with a target call: its wall time, and the target's forward passes and wait for them (seconds).
    round_times: list[tuple[float, float, float]] = field(default_factory=list)
    target_rows: float | None = None  # sessions per target forward pass over the level
    runs: int = 0  # how many runs were folded in (`add`)
    run_tokens_per_s: list[float] = field(default_factory=list)  # each folded run's own, in the order run

    def add(self, run: Level) -> None:
        """Fold in another run of the same level: tokens and seconds summed, samples pooled, rows per
        pass averaged over the runs."""
        self.tokens, self.seconds = self.tokens + run.tokens, self.seconds + run.seconds
        self.first_token_s += run.first_token_s
        self.gaps_s += run.gaps_s
        self.gammas += run.gammas
        self.round_times += run.round_times
        if run.target_rows is not None:
            self.target_rows = run.target_rows if self.target_rows is None else \
                (self.target_rows * self.runs + run.target_rows) / (self.runs + 1)
        self.runs += 1
        self.run_tokens_per_s.append(run.tokens_per_s())

    def tokens_per_s(self) -> float:
        """Tokens over seconds, as a row reports them (3 decimals)."""
        return round(self.tokens / self.seconds, 3)

    def row(self, name: str, users: int) -> dict:
        gaps = sorted(self.gaps_s) or [None]  # none timed: an HTTP user's chunks hold an unknown count of tokens
        wall, forward, wait = [round(1e3 * statistics.mean(t), 2) for t in zip(*self.round_times)] or [None] * 3
        return {"config": name, "users": users, "tokens_per_s": self.tokens_per_s(),
                "ttft_s": round(statistics.mean(self.first_token_s), 3) if self.first_token_s else None,
                "itl_p50_ms": milliseconds(gaps[len(gaps) // 2]),
                "itl_p95_ms": milliseconds(gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))]),
                "mean_gamma": round(statistics.mean(self.gammas), 2) if self.gammas else None,
                "target_rows_per_pass": None if self.target_rows is None else round(self.target_rows, 2),
                "round_ms": wall, "target_forward_ms": forward, "target_wait_ms": wait,
                "runs": max(self.runs, 1), "run_tokens_per_s": self.run_tokens_per_s}


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(1e3 * seconds, 1)


def _stream(endpoint: str, prompt: str, n: int, gamma: int | None, level: Level, lock: threading.Lock) -> None:
    began = last = time.perf_counter()
    first, gaps, tokens, gammas, times = None, [], 0, [], []
    with open_channel(endpoint, CHANNEL_OPTIONS) as channel:
        for reply in pb_grpc.SpecDecStub(channel).Generate(make_request(prompt=prompt, max_new_tokens=n, gamma=gamma)):
            r = reply.round
            gammas.append(r.gamma)
            if r.target_compute_s > 0 and first is not None:  # decoding rounds (the first one prefills)
                times.append((r.wall_s, r.target_forward_s, r.target_wait_s))
            if not reply.token_ids:
                continue
            now = time.perf_counter()
            if first is None:
                first = now - began
            else:
                gaps += [(now - last) / len(reply.token_ids)] * len(reply.token_ids)
            last, tokens = now, tokens + len(reply.token_ids)
    with lock:
        level.tokens += tokens
        level.gaps_s += gaps
        level.gammas += gammas
        level.round_times += times
        if first is not None:
            level.first_token_s.append(first)


def level_prompts(base: list[str], users: int, repeat: int) -> list[str]:
    """The prompts of a level's `repeat`-th run, one a user: the set in turn, each run going on where the last left
    off, so that a level of fewer users than prompts meets them all over its repeats (every config the same ones)."""
    return [base[(repeat * users + i) % len(base)] for i in range(users)]


def run_level(endpoint: str, prompts: list[str], n: int, gamma: int | None, target=None, stream=_stream) -> Level:
    """Every prompt streamed at once; with `target` (a client), also its sessions per forward pass.
    `stream(endpoint, prompt, n, gamma, level, lock)` runs one user's generation (gRPC by default); the first
    user's error, if any, is raised once all have ended."""
    level, lock, errors = Level(), threading.Lock(), []

    def user(prompt: str) -> None:
        try:
            stream(endpoint, prompt, n, gamma, level, lock)
        except Exception as e:  # noqa: BLE001 - re-raised below, on the caller's thread
            errors.append(e)

    before = target.info() if target is not None else None
    threads = [threading.Thread(target=user, args=(p,)) for p in prompts]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    level.seconds = time.perf_counter() - began
    if errors:
        raise errors[0]
    if before is not None:
        after = target.info()
        passes = after.forward_passes - before.forward_passes
        level.target_rows = (after.forward_steps - before.forward_steps) / max(passes, 1)
    return level


class HFBatched:
    """Hugging Face `generate` on a padded batch of prompts (left padding), target only, same kernels."""

    def __init__(self, args: argparse.Namespace, path: str, kernel: str):
        from specdec.engine.models import resolve_device
        from specdec.weights.sources import load_tokenizer

        self.tokenizer = load_tokenizer(weights.resolve(args.target_model))
        self.tokenizer.padding_side = "left"
        self.device = resolve_device(args.device)
        self.model = hf_baseline(args.target_model, self.device, path, kernel)

    def __call__(self, prompts: list[str], n: int) -> Level:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        began = time.perf_counter()
        out = off_the_initial_thread(greedy_generate, self.model, batch.input_ids, attention_mask=batch.attention_mask,
                                     max_new_tokens=n, pad_token_id=pad)
        seconds = time.perf_counter() - began
        generated = out[:, batch.input_ids.shape[1]:]
        tokens = int((generated != pad).sum())
        return Level(tokens, seconds, [seconds], [seconds / n] * tokens)  # no streaming: TTFT = the whole batch


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("tokens_per_s", "aggregate tokens/s", "throughput"), ("ttft_s", "mean time to first token (s)",
              "first token"), ("itl_p95_ms", "p95 inter-token latency (ms)", "latency"))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    for name in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == name]
        for ax, (key, _, _) in zip(axes, panels):
            shown = [r for r in mine if r[key] is not None]  # a peer has no ITL, a failed level no TTFT
            ax.plot([r["users"] for r in shown], [r[key] for r in shown], marker="o", label=name)
    for ax, (_, label, title) in zip(axes, panels):
        ax.set(xlabel="concurrent users", ylabel=label, title=title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_concurrency_sweep(args: argparse.Namespace) -> int:
    from orchestrator.clients import target_client
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack

    levels = [int(x) for x in args.concurrency.split(",") if x]
    base = [p["prompt"] for p in load_prompts(args.prompts, args.limit_prompts)]
    rows = []
    peers = [(name, url, None, {"stream": peer_stream(url, base[0])}) for name, url in parse_peers(args.peers)]
    with EmbeddedStack(stack_options(args, max_sessions=max(64, 2 * max(levels)))) as stack:
        _, target_info = service_infos(stack)
        hf = None if args.no_hf else HFBatched(args, target_info.compute_path, target_info.kernel)
        warm_up(stack.endpoint, base[0], args.gamma_max)
        target = target_client(stack.target_address)
        configs = [(name, stack.endpoint, gamma, {"target": target}) for name, gamma in zip(SERVING, (0, None))]
        configs += peers
        for users in levels:
            levels_run = {name: Level() for name, *_ in configs}
            for repeat in range(args.repeats):  # A B C C B A ...: the machine's speed drifts within minutes
                prompts = level_prompts(base, users, repeat)
                for name, endpoint, gamma, how in configs if repeat % 2 == 0 else configs[::-1]:
                    levels_run[name].add(run_level(endpoint, prompts, args.max_new_tokens, gamma, **how))
            level_rows = [levels_run[name].row(name, users) for name, *_ in configs]
            if hf is not None:  # one batch, of the first run's prompts
                level_rows.append(hf(level_prompts(base, users, 0), args.max_new_tokens).row(HF_BATCHED, users))
            print("  ".join(f"{r['config']}@{users}: {r['tokens_per_s']} tok/s" for r in level_rows), flush=True)
            rows += level_rows
    print(f"machine: {target_info.hardware}; path {target_info.compute_path} ({target_info.kernel})")
    print("config | users | tok/s | TTFT s | ITL p50 ms | ITL p95 ms | mean γ | target rows/pass | "
          "round ms | target forward ms | target wait ms")
    for r in rows:
        print(f"{r['config']} | {r['users']} | {r['tokens_per_s']} | {r['ttft_s']} | {r['itl_p50_ms']} | "
              f"{r['itl_p95_ms']} | {r['mean_gamma']} | {r['target_rows_per_pass']} | {r['round_ms']} | "
              f"{r['target_forward_ms']} | {r['target_wait_ms']}")
    for name, *_ in peers:
        print(f"over {name}: " + "  ".join(ratios(rows, name)))
    save_rows(args.output, target_info, args.max_new_tokens, rows, plot)
    return 0


SERVING = ("target-only", "adaptive")  # our stack's configs, which the peers' rows are put under
HF_BATCHED = "hf-generate-batched"

# llama-server keeps a slot's prompt for the next request that starts the same way unless told not to; our bench
# stack keeps no ended session's cache (`--prefix-cache-mb 0`), so neither does the peer. Other servers ignore it.
PEER_REQUEST = {"cache_prompt": False}


def parse_peers(spec: str) -> list[tuple[str, str]]:
    """"llama=http://127.0.0.1:8091,..." -> [(name, base URL)]; each name a config of its own."""
    peers = []
    for item in filter(None, spec.split(",")):
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith("http://"):
            raise SystemExit(f"--peers: {item!r} is not NAME=http://HOST:PORT")
        if name in (*SERVING, HF_BATCHED) or name in dict(peers):
            raise SystemExit(f"--peers: the name {name!r} is taken (ours: {', '.join((*SERVING, HF_BATCHED))})")
        peers.append((name, url.rstrip("/")))
    return peers


def peer_stream(url: str, prompt: str):
    """The `run_level` stream of the peer at `url`, once it has answered one short completion of `prompt` (before
    our stack loads, so that a peer that refuses, or is not there, ends the run at once)."""
    try:
        stream = http_stream(served_model(url), PEER_REQUEST)
        run_level(url, [prompt], 1, None, stream=stream)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise SystemExit(f"--peers: {url} did not answer a completion: {error}") from error
    return stream


def ratios(rows: list[dict], peer: str) -> list[str]:
    """Each of our configs' tokens/s over the peer's, level by level."""
    peer_tps = {r["users"]: r["tokens_per_s"] for r in rows if r["config"] == peer}
    return [f"{r['config']}@{r['users']} {r['tokens_per_s'] / peer_tps[r['users']]:.3f}x" for r in rows
            if r["config"] in SERVING and peer_tps.get(r["users"])]
