"""A chat's turns after a long context, target-only against adaptive, through a running server: an agent's regime,
where each call resends files and history that both services keep from the last call.

The context (this repository's code, or `--prose`: docs/PERFORMANCE.md, its first N tokens) and then, per turn, a
question and a 128-token greedy reply (`ignore_eos`); each turn's prompt is the last turn's prompt and reply and
the next question, so the services' kept caches hold all but the question. Each turn runs target-only and adaptive
on the same prompt (their order alternating); their replies must be the same tokens. Prints one JSON line a turn:
each mode's tokens/s after its first token, the adaptive reply's draft tokens and the positions its draft replica
took from its cache (`draft_cached_tokens`). `--think-s`: a pause before each request, in which the services are
idle but for what they finish in the background (a draft's feed ahead). Start a server first, with a context that
holds the chat:

    .venv/bin/specdec serve --port 50070 --http-port 8088 --context 8192 &
    .venv/bin/python scripts/chat_at_depth.py --tokens 3000 --turns 4

docs/PERFORMANCE.md, "A chat's next turn prices what its draft keeps", has its figures.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request

from decode_at_depth import NEW_TOKENS, prose_prompt
from long_prompt_beside import long_prompt
from openai import OpenAI

from specdec.cli.client import generate, make_request

QUESTIONS = ("\n\n# What does the code above do? Explain it in plain words.\n",
             "\n\n# Which function above is the hardest to test, and why?\n",
             "\n\n# Write a test for the first class above.\n",
             "\n\n# Suggest one change that would make the code above faster.\n")


def tokenize(url: str, model: str, text: str) -> list[int]:
    body = json.dumps({"model": model, "prompt": text, "add_special_tokens": False}).encode()
    request = urllib.request.Request(url.removesuffix("/v1") + "/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)["tokens"]


def reply(endpoint: str, prompt: list[int], salt: str = "", **speculation) -> tuple[list[int], float, dict]:
    """One greedy NEW_TOKENS reply: its tokens, tokens/s after the first token, and its stats with the tokens the
    draft model proposed (`model_drafted`; the others came from lookups) and the wall time (`total_s`). `salt`: the
    request's `cache_salt` (caches are shared only within one)."""
    request = make_request(prompt_token_ids=prompt, max_new_tokens=NEW_TOKENS, **speculation)
    request.ignore_eos, request.cache_salt = True, salt
    out = generate(endpoint, request, timeout=900)
    stats = {**out.stats, "model_drafted": sum(r.drafted for r in out.rounds if r.proposer == "model"),
             "total_s": out.seconds}
    return out.token_ids, (len(out.token_ids) - 1) / (out.seconds - out.first_token_s), stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8088/v1", help="the server's HTTP API (to tokenize)")
    parser.add_argument("--endpoint", default="127.0.0.1:50070", help="the server's gRPC API")
    parser.add_argument("--tokens", type=int, default=3000, help="the context's length")
    parser.add_argument("--prose", action="store_true", help="docs/PERFORMANCE.md instead of this repository's code")
    parser.add_argument("--proposer", default="", help="adaptive's proposer (default: the server's)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--own-caches", action="store_true",
                        help="each mode on a cache salt of its own: neither finds the other's turns in a cache, so "
                             "turn 1 takes the whole context in both (a fresh server runs each context once)")
    parser.add_argument("--think-s", type=float, default=0.0,
                        help="seconds between one reply and the next request: a user reading, an agent's tool running")
    args = parser.parse_args()
    model = OpenAI(base_url=args.url, api_key="unused").models.list().data[0].id
    prompt = (prose_prompt if args.prose else long_prompt)(args.url, model, args.tokens)
    modes = {"target-only": {"gamma": 0}, "adaptive": {"proposer": args.proposer}}
    for turn in range(args.turns):
        prompt = prompt + tokenize(args.url, model, QUESTIONS[turn % len(QUESTIONS)])
        rates, replies, stats = {}, {}, {}
        for name in (modes if turn % 2 == 0 else reversed(modes)):
            time.sleep(args.think_s)
            salt = name if args.own_caches else ""
            replies[name], rates[name], stats[name] = reply(args.endpoint, prompt, salt, **modes[name])
        adaptive = stats["adaptive"]
        print(json.dumps({"turn": turn + 1, "prompt_tokens": len(prompt),
                          **{name: round(rate, 2) for name, rate in rates.items()},
                          "ratio": round(rates["adaptive"] / rates["target-only"], 3),
                          "wall_ratio": round(stats["target-only"]["total_s"] / adaptive["total_s"], 3),
                          "draft_tokens": adaptive.get("draft_tokens", 0), "model_drafted": adaptive["model_drafted"],
                          "alpha": round(adaptive.get("alpha", 0), 3),
                          "draft_cached_tokens": adaptive.get("draft_cached_tokens", 0),
                          "identical": replies["target-only"] == replies["adaptive"]}), flush=True)
        prompt = prompt + replies["target-only"]


if __name__ == "__main__":
    main()
