"""The `specdec` command: serve, generate, bench."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path

from specdec.cli.options import add_stack_args, gamma_arg, gamma_list, stack_options
from specdec.http.flags import add_http_args, http_config
from specdec.runtime import security, telemetry
from specdec.runtime.security import security_from_args
from specdec.runtime.options import add_options
from specdec.runtime.server import ServerConfig, configure_logging, exit_now, stop_signals, wait_for_stop

log = logging.getLogger(__name__)


def cmd_serve(args: argparse.Namespace) -> int:
    from specdec.launch.stack import EmbeddedStack

    opts = stack_options(args, port=args.port, draft_replicas=args.draft_replicas, grammar_warmup="startup")
    if args.ray:
        from specdec.launch.ray_stack import RayStack

        stack_cm = RayStack(opts, args.ray_address, args.draft_replicas, args.ray_cpus_per_process,
                            args.ray_gpus_per_process)
    else:
        stack_cm = EmbeddedStack(opts)
    stop, hurry = stop_signals()  # drain, then stop every child, leaving no orphan
    with stack_cm as stack:
        print(f"specdec serving on {stack.endpoint}", flush=True)
        print(f"services: draft {','.join(stack.draft_addresses) or 'none'}, target {stack.target_address}",
              flush=True)
        http = None
        if args.http_port >= 0:
            from specdec.http.server import start_http

            config = http_config(args, stack.endpoint, redis_url=args.redis_url)
            http = start_http(config, args.http_host or opts.host, args.http_port, args.log_level.lower())
            print(f"specdec OpenAI-compatible API on {http.url}/v1", flush=True)
        wait_for_stop(stop)
        log.info("draining: requests in flight get up to %.0f s (a second signal ends them now)", args.drain_timeout_s)
        stack.drain(args.drain_timeout_s, hurry)
        log.info("stopping every service")
        if http is not None:
            http.stop()
    return 0


def say_what_runs(stack) -> None:
    """One line a service on stderr: which weights, on which compute path and kernel, on what hardware."""
    from specdec.tools.bench.speed import service_infos

    if not stack.draft_address:  # no draft service to ask
        return
    for role, info in zip(("draft", "target"), service_infos(stack)):
        cut = f", output layer {info.scored_tokens:,} of {info.vocab_size:,} token ids" \
            if 0 < info.scored_tokens < info.vocab_size else ""
        print(f"{role}: {info.model or 'n-gram lookups'} on path {info.compute_path or '-'} "
              f"(kernel {info.kernel or '-'}{cut}), {info.hardware}", file=sys.stderr, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    import grpc

    from specdec.cli.client import generate, make_request

    request = make_request(prompt=args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed, gamma=args.gamma, stop=args.stop,
                           top_logprobs=args.logprobs)
    on_text = None if args.json else (lambda text: print(text, end="", flush=True))

    def run(endpoint: str) -> None:
        result = generate(endpoint, request, on_text=on_text)
        if args.json:
            print(json.dumps(result.to_json()), flush=True)
        else:
            s = result.stats
            print(f"\n\n[{s['generated_tokens']} tokens, {s['tokens_per_second']:.2f} tok/s, {s['rounds']} rounds, "
                  f"acceptance {s['acceptance_rate']:.2f}, mean accepted length {s['mean_accepted_length']:.2f}, "
                  f"finish {s['finish_reason']}]", file=sys.stderr, flush=True)

    try:
        if args.endpoint:
            run(args.endpoint)
        else:
            from specdec.launch.stack import EmbeddedStack

            with EmbeddedStack(stack_options(args)) as stack:
                say_what_runs(stack)
                run(stack.endpoint)  # the result is out before the services stop
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    return 0


# `specdec bench`'s sweeps: (the flag that asks for it, its module in specdec.tools.bench, its entry point)
BENCH_SWEEPS = (("gpu", "gpu", "run_gpu_bench"), ("constrained", "constrained", "run_constrained"),
                ("cpu_curve", "cpu_curve", "run_cpu_curve"), ("depths", "depth", "run_depths"),
                ("kernel_ab", "kernel_ab", "run_kernel_ab"),
                ("concurrency", "concurrency", "run_concurrency_sweep"), ("tp_sweep", "tp", "run_tp_sweep"),
                ("workloads", "workloads", "run_workloads"), ("http", "http_overhead", "run_http_overhead"),
                ("overlap_rtt", "overlap", "run_overlap_sweep"), ("rtt_ms", "network", "run_rtt_sweep"),
                ("turns", "chat", "run_chat"), ("samplers", "samplers", "run_samplers"))


def cmd_bench(args: argparse.Namespace) -> int:
    """The first sweep the flags ask for, else the speed benchmark (each imports its own heavy code)."""
    for flag, module, entry in BENCH_SWEEPS:
        if getattr(args, flag):
            return getattr(importlib.import_module(f"specdec.tools.bench.{module}"), entry)(args)
    from specdec.tools.bench.speed import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="distributed speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the embedded local stack and print its endpoint")
    add_stack_args(serve)
    serve.add_argument("--port", type=int, default=50051, help="orchestrator port (0 = any free port)")
    serve.add_argument("--draft-replicas", type=int, default=1,
                       help="draft service replicas (0: no draft model at all; lookups draft, with --proposer "
                            "ngram or hybrid)")
    serve.add_argument("--ray", action="store_true", help="place the draft replicas and the target's tensor-parallel "
                       "ranks as Ray actors with placement groups")
    serve.add_argument("--ray-address", default="", help="Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    serve.add_argument("--ray-cpus-per-process", type=float, default=1.0, help="CPUs reserved per service process")
    serve.add_argument("--ray-gpus-per-process", type=float, default=0.0,
                       help="GPUs reserved per service process (1 on GPU clusters: one per draft, one per rank)")
    add_options(serve, ServerConfig, only=("drain_timeout_s",))
    add_http_args(serve)
    serve.set_defaults(func=cmd_serve)

    gen = sub.add_parser("generate", help="run one generation")
    add_stack_args(gen)
    gen.set_defaults(feed_between_turns="off")  # one reply, no next turn to feed the draft for
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--gamma", type=gamma_arg, default=None, help="auto (default) or a fixed γ; 0 = target only")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--endpoint", default="", help="HOST:PORT of a running orchestrator; default: start one")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids, stats")
    gen.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="with --json: each token's log-probability and its K (0-20) likeliest alternatives")
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="target-only vs speculative vs Hugging Face assisted generation")
    add_stack_args(bench)
    # Its prompts are not one conversation's turns, and its baselines run between them: no feed after a reply.
    bench.set_defaults(feed_between_turns="off")
    bench.add_argument("--gammas", type=gamma_list, default="1,2,3,4,6",
                       help="fixed γ values to run beside target-only and adaptive (\"\" for none)")
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--prompts", default="", help="JSON file of prompts (default: the checked-in set)")
    bench.add_argument("--limit-prompts", type=int, default=0, help="use only the first N prompts")
    bench.add_argument("--no-hf", action="store_true", help="skip the Hugging Face assisted baseline")
    bench.add_argument("--rtt-ms", default="", help="e.g. 0,5,20,50: sweep added RTT through delay proxies "
                       "and compare adaptive γ with every fixed γ")
    bench.add_argument("--paths", default="", help="e.g. fp32,bf16,int8: target-only, adaptive and HF assisted on "
                       "each compute path, with each lossy path's greedy agreement with fp32")
    bench.add_argument("--tp-sweep", default="", help="e.g. 1,2: run the target at each tensor-parallel size and "
                       "compare memory per worker, step and verify time, tokens/s")
    bench.add_argument("--concurrency", default="", help="e.g. 1,4,8,16: that many users at once; aggregate tok/s, "
                       "TTFT and p50/p95 inter-token latency for target-only, adaptive and batched HF generate")
    bench.add_argument("--repeats", type=int, default=1, help="with --concurrency: run target-only and adaptive "
                       "this many times at each level, alternating their order, and sum the runs; with --samplers: "
                       "seeds per prompt")
    bench.add_argument("--peers", default="", help="with --concurrency: NAME=http://HOST:PORT,... OpenAI-compatible "
                       "servers on the same model (e.g. llama-server -np 8) driven at each level too, in the "
                       "alternation, and our configs' tok/s over theirs")
    bench.add_argument("--workloads", default="", help="e.g. editing,code,prose: target-only, model, ngram, hybrid "
                       "and HF prompt lookup per workload (chat prompts), with α, accepted length and lookup share")
    bench.add_argument("--http", default="", help="e.g. 1,8: that many users through gRPC and through the OpenAI "
                       "HTTP API on one stack; tok/s per transport and the HTTP layer's cost")
    bench.add_argument("--overlap-rtt", default="", help="e.g. 0,5,20,50: hybrid with and without drafting during "
                       "verification, through delay proxies; pin the services with --draft-cpus/--target-cpus")
    bench.add_argument("--gpu", action="store_true", help="the GPU benchmark on CUDA: step curves against the "
                       "bandwidth floor, HF eager and compiled static-cache generate, target-only, fixed and adaptive "
                       "γ, 8 users (on the synthetic pair unless models are given)")
    bench.add_argument("--no-hf-compiled", action="store_true", help="with --gpu: skip HF's compiled static cache")
    bench.add_argument("--gpu-steps", action="store_true", help="with --gpu: only the step curves, the static "
                       "runner eager and compiled (SPECDEC_STATIC_COMPILE) beside each other")
    bench.add_argument("--gpu-services", action="store_true", help="with --gpu: only the services, one user and 8 "
                       "(no step curves, agreement or Hugging Face): two builds side by side in little device time")
    bench.add_argument("--gpu-hf", action="store_true", help="with --gpu-services: then Hugging Face's compiled "
                       "static cache too, the reference of the GPU goal, in the same run")
    bench.add_argument("--samplers", default="", help="e.g. 0.7,1.0: sampled decoding at these temperatures, the "
                       "coupled sampler against the rejection sampler (tok/s, drafts accepted), and whether each "
                       "coupled output equals target-only's")
    bench.add_argument("--constrained", action="store_true", help="structured output: target-only and adaptive, "
                       "with and without a JSON schema, answers checked against it, and the mask's cost per row")
    bench.add_argument("--cpu-curve", default="", help="e.g. gguf-q8,gguf: the target's forward time for 1, 2, 5 "
                       "and 9 tokens on each CPU path against its bandwidth and compute floors")
    bench.add_argument("--depths", default="", help="e.g. 0,1024,3072,6144: the target's one-token step and a "
                       "256-token prompt chunk after that many tokens of context (an agent's regime)")
    bench.add_argument("--llama-bench", default="", help="with --cpu-curve: llama-bench's JSON (-p 1,2,5,9 -n 0 "
                       "-o json) on the same GGUF, drawn beside; with --depths: its -p 256 -n 16 -d <depths>")
    bench.add_argument("--kernel-ab", default="", help="A.so,B.so: two builds of the integer kernel on the "
                       "target's linears and whole passes, alternating in one process (a kernel change beside its "
                       "baseline)")
    bench.add_argument("--kernel-ab-repeats", type=int, default=20, help="with --kernel-ab: measurements per build")
    bench.add_argument("--kernel-ab-sizes", default="1,2,3,5", help="with --kernel-ab: the rows a pass (tokens)")
    bench.add_argument("--kernel-ab-depths", default="", help="with --kernel-ab: e.g. 2048,6144: whole passes after "
                       "that many tokens of context as well (attention at depth)")
    bench.add_argument("--turns", type=int, default=0, help="a chat of N turns, each resending the conversation, "
                       "with ended sessions' caches kept (--prefix-cache-mb, else the services' default) and without: "
                       "time to first token per turn, and the replies compared")
    bench.add_argument("--output", default="bench_results.json")
    # Every config meets each prompt fresh: with a memory, a config would look up the outputs of the
    # configs that ran the prompt before it, and with kept caches it would skip the prompt's prefill.
    bench.set_defaults(lookup_memory_tokens=0, prefix_cache_mb=0)
    bench.set_defaults(func=cmd_bench)
    prof = sub.add_parser("profile", help="loop-latency breakdown from per-round spans (runs a workload or reads "
                                          "an OTLP JSON span file)")
    add_stack_args(prof)
    prof.set_defaults(feed_between_turns="off")  # as bench: its prompts are not one conversation's turns
    prof.add_argument("--spans", default="", help="OTLP JSON lines file to analyse instead of running a workload")
    prof.add_argument("--max-new-tokens", type=int, default=64)
    prof.add_argument("--gamma", type=gamma_arg, default=None, help="auto (default) or a fixed γ")
    prof.add_argument("--rtt-ms", type=float, default=0.0, help="added RTT on both hops through delay proxies")
    prof.add_argument("--prompts", default="", help="JSON file of prompts (default: the checked-in set)")
    prof.add_argument("--limit-prompts", type=int, default=0)
    prof.add_argument("--output", default="profile.json", help="summary JSON; the PNG goes next to it")
    prof.set_defaults(prefix_cache_mb=0)  # each round's prefill as a cold start has it
    prof.set_defaults(func=cmd_profile)
    return parser


def cmd_profile(args: argparse.Namespace) -> int:
    from specdec.tools.profiling.profile import run_profile

    return run_profile(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    security.use(security_from_args(args))  # this process's orchestrator and client channels
    logging.getLogger("orchestrator").setLevel(args.log_level.upper())
    if args.command == "profile" and not args.spans and not args.trace_file:
        args.trace_file = str(Path(args.output).with_suffix(".spans.jsonl"))  # kept for a second look
    # The embedded orchestrator runs in this process: its spans and metrics are configured here.
    installed = telemetry.configure("specdec-orchestrator", args.otlp_endpoint, args.trace_file, args.metrics_port,
                                    "127.0.0.1", prometheus=getattr(args, "http_port", -1) >= 0)
    try:
        return args.func(args)
    finally:
        installed.shutdown()


def run() -> None:
    """The `specdec` command: `main()`, then the process ends with its code, skipping the interpreter's teardown
    (`exit_now`: about a second after the output is out)."""
    exit_now(main() or 0)


if __name__ == "__main__":
    run()
