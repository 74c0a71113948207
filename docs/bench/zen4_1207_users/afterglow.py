"""CPU a server's processes spend in the seconds after a level of 8 users ends (ours, then llama-server's): does
the alternation give the config after a peer (or after ours) a slower start? Usage, from the repository root:
.venv/bin/python docs/bench/zen4_1207_users/afterglow.py <llama-server> -m <gguf> -t 2 --port 8091 -c 4096 -np 8"""
import json, os, subprocess, sys, time
import psutil
from specdec.tools.bench.concurrency import run_level
from specdec.tools.bench.openai_stream import http_stream, served_model
from specdec.cli.main import build_parser
from specdec.cli.options import stack_options
from specdec.launch.stack import EmbeddedStack

prompts = [p["prompt"] for p in json.load(open("specdec/tools/bench/prompts.json"))] * 2

def cpu(procs):
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times(); total += t.user + t.system
        except psutil.Error:
            pass
    return total

def glow(procs, run):
    run()
    a = cpu(procs); t0 = time.perf_counter(); marks = []
    for dt in (0.1, 0.25, 0.5, 1.0, 2.0):
        time.sleep(max(0.0, dt - (time.perf_counter() - t0)))
        marks.append(f"{dt}s:{cpu(procs) - a:.3f}")
    return " ".join(marks)

srv = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(6)
url = "http://127.0.0.1:8091"
s = http_stream(served_model(url), {"cache_prompt": False})
lp = [psutil.Process(srv.pid)]
args = build_parser().parse_args(["bench", "--no-hf"])
with EmbeddedStack(stack_options(args, max_sessions=64)) as stack:
    ours = psutil.Process().children(recursive=True)
    ours = [p for p in ours if p.pid != srv.pid]
    for rep in range(3):
        print("ours  target-only", glow(ours, lambda: run_level(stack.endpoint, prompts, 64, 0)), flush=True)
        print("ours  adaptive   ", glow(ours, lambda: run_level(stack.endpoint, prompts, 64, None)), flush=True)
        print("llama            ", glow(lp, lambda: run_level(url, prompts, 64, None, stream=s)), flush=True)
srv.terminate()
