"""Drive llama-server over the bench prompts: greedy, n tokens each; prints tok/s (wall, and llama's own)."""
import json, sys, time, urllib.request
port, n = int(sys.argv[1]), int(sys.argv[2])
prompts = [p["prompt"] for p in json.load(open("/work/main/specdec/tools/bench/prompts.json"))]
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())
post({"prompt": "warm up", "n_predict": 4, "temperature": 0})
tokens = wall = 0; own = []; accepted = drafted = 0
for p in prompts:
    t = time.perf_counter()
    r = post({"prompt": p, "n_predict": n, "temperature": 0, "cache_prompt": False, "ignore_eos": True})
    wall += time.perf_counter() - t
    tokens += r["timings"]["predicted_n"]; own.append(r["timings"]["predicted_per_second"])
    drafted += r["timings"].get("draft_n", 0); accepted += r["timings"].get("draft_n_accepted", 0)
print(json.dumps({"tok_s_wall": tokens / wall, "tok_s_llama": sum(own) / len(own), "tokens": tokens,
                  "draft_n": drafted, "draft_accepted": accepted}))
