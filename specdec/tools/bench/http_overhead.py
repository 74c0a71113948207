"""`specdec bench --http 1,8`: what the OpenAI HTTP layer costs against gRPC, on the same stack.

One embedded stack, the HTTP API in this process in front of it (as `specdec serve --http-port`
runs it). For each level N, N users stream the same greedy, adaptive-γ generations through gRPC
and through HTTP (SSE, read with the standard library), alternating which goes first, `repeats`
times. It prints aggregate tokens/s per transport and their ratio, per level, and the HTTP layer's
own CPU time per token (its event loop's thread), which a tok/s ratio cannot resolve below noise.
"""

from __future__ import annotations

import argparse
import os
import statistics

from specdec.tools.bench.concurrency import run_level
from specdec.tools.bench.openai_stream import http_stream, served_model
from specdec.tools.bench.speed import load_prompts, save_rows, service_infos, warm_up


def run_http_overhead(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.http.flags import HttpConfig
    from specdec.http.server import start_http
    from specdec.launch.stack import EmbeddedStack

    levels = [int(x) for x in args.http.split(",") if x]
    base = [p["prompt"] for p in load_prompts(args.prompts, args.limit_prompts)]
    repeats = 3
    results: dict[tuple[str, int], list[float]] = {}
    cpu: dict[int, list] = {}  # users -> [HTTP thread CPU s, tokens, wall s] over the HTTP runs
    with EmbeddedStack(stack_options(args, max_sessions=max(64, 2 * max(levels)))) as stack:
        _, target_info = service_infos(stack)
        api = start_http(HttpConfig(endpoint=stack.endpoint), "127.0.0.1", 0)
        model = served_model(api.url)
        warm_up(stack.endpoint, base[0], args.gamma_max)
        try:
            for repeat in range(repeats):
                for users in levels:
                    prompts = [base[i % len(base)] for i in range(users)]
                    order = [("grpc", stack.endpoint, {}), ("http", api.url, {"stream": http_stream(model)})]
                    for name, endpoint, how in order if repeat % 2 == 0 else order[::-1]:
                        cpu_before = thread_cpu_s(api.thread.native_id)
                        level = run_level(endpoint, prompts, args.max_new_tokens, None, **how)
                        results.setdefault((name, users), []).append(level.tokens / level.seconds)
                        if name == "http":  # the HTTP layer's own work: its event loop's CPU time
                            spent = cpu.setdefault(users, [0.0, 0, 0.0])
                            spent[0] += thread_cpu_s(api.thread.native_id) - cpu_before
                            spent[1] += level.tokens
                            spent[2] += level.seconds
                        print(f"{name}@{users} (run {repeat + 1}): {level.tokens / level.seconds:.2f} tok/s",
                              flush=True)
        finally:
            api.stop()
    rows = []
    for users in levels:
        grpc_tps, http_tps = (statistics.mean(results[(name, users)]) for name in ("grpc", "http"))
        cpu_s, tokens, wall_s = cpu[users]
        rows.append({"users": users, "grpc_tokens_per_s": round(grpc_tps, 3), "http_tokens_per_s": round(http_tps, 3),
                     "http_over_grpc": round(http_tps / grpc_tps, 4),
                     "http_cpu_ms_per_token": round(1e3 * cpu_s / tokens, 3),
                     "http_cpu_share": round(cpu_s / wall_s, 4),  # of one core, while serving
                     "runs": {name: [round(x, 3) for x in results[(name, users)]] for name in ("grpc", "http")}})
    print(f"machine: {target_info.hardware}; path {target_info.compute_path} ({target_info.kernel}); "
          f"{args.max_new_tokens} tokens per user, greedy, adaptive γ, {repeats} runs each, order alternated")
    print("users | gRPC tok/s | HTTP tok/s | HTTP / gRPC | HTTP layer CPU ms/token | HTTP layer share of a core")
    for r in rows:
        print(f"{r['users']} | {r['grpc_tokens_per_s']} | {r['http_tokens_per_s']} | {r['http_over_grpc']} | "
              f"{r['http_cpu_ms_per_token']} | {r['http_cpu_share']:.2%}")
    save_rows(args.output, target_info, args.max_new_tokens, rows)
    return 0


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux /proc)."""
    fields = open(f"/proc/self/task/{native_id}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
