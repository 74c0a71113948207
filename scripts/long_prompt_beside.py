"""What a long prompt costs a reply that is streaming: the reply's tokens/s while the prompt goes in, and the
prompt's seconds to its first token.

One reply streams (a code prompt, `ignore_eos`, greedy); once it has 30 tokens, a prompt of N tokens (this
repository's own source, by the server's tokenizer; a fresh `cache_salt`, so that no kept cache spares it its
compute) is sent for one token. Prints one JSON line: the reply's tok/s before, during and after, and the
prompt's seconds. Start a server first, with a context that holds the prompt:

    .venv/bin/specdec serve --http-port 8088 --context 8192 &
    .venv/bin/python scripts/long_prompt_beside.py --url http://127.0.0.1:8088/v1 --tokens 2000

`--prompt-slowdown` on the server sets what the prompt may cost the reply (docs/PERFORMANCE.md, "A long prompt
beside decoding sessions").
"""

from __future__ import annotations

import argparse
import json
import secrets
import threading
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

REPLY_PROMPT = "def quicksort(items):"
SOURCE = sorted((Path(__file__).resolve().parent.parent / "specdec").rglob("*.py"))


def long_prompt(url: str, model: str, tokens: int) -> list[int]:
    """The first `tokens` ids of this repository's source, by the server's `/tokenize`."""
    text = "".join(path.read_text() for path in SOURCE)
    body = json.dumps({"model": model, "prompt": text}).encode()
    request = urllib.request.Request(url.removesuffix("/v1") + "/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        ids = json.load(reply)["tokens"]
    if len(ids) < tokens:
        raise SystemExit(f"the source holds {len(ids)} tokens, fewer than {tokens}")
    return ids[:tokens]


def tokens_per_s(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def measure(client: OpenAI, model: str, prompt: list[int], reply_tokens: int, gamma: int | None) -> dict:
    arrivals: list[float] = []  # one per reply token, when its chunk came
    prompt_done = threading.Event()

    def stream() -> None:
        extra = {"ignore_eos": True, **({} if gamma is None else {"gamma": gamma})}
        for chunk in client.completions.create(model=model, prompt=REPLY_PROMPT, max_tokens=reply_tokens,
                                               temperature=0, logprobs=0, stream=True, extra_body=extra):
            now = time.monotonic()
            arrivals.extend([now] * len(chunk.choices[0].logprobs.tokens))
            if prompt_done.is_set() and now > ended[0] + 5:
                break

    ended = [0.0]
    reply = threading.Thread(target=stream)
    reply.start()
    while len(arrivals) < 30 and reply.is_alive():
        time.sleep(0.05)
    began = time.monotonic()
    client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                              extra_body={"cache_salt": secrets.token_hex(8)})  # computed, whatever the server keeps
    ended[0] = time.monotonic()
    prompt_done.set()
    reply.join()
    during = [t for t in arrivals if began <= t <= ended[0]]
    return {"prompt_tokens": len(prompt), "prompt_s": round(ended[0] - began, 2),
            "reply_before_tok_s": round(tokens_per_s([t for t in arrivals if t < began][-20:]), 2),
            "reply_during_tok_s": round(len(during) / (ended[0] - began), 2),
            "reply_after_tok_s": round(tokens_per_s([t for t in arrivals if t > ended[0]]), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8088/v1")
    parser.add_argument("--tokens", type=int, default=2000, help="the long prompt's length")
    parser.add_argument("--reply-tokens", type=int, default=2000, help="long enough to outlast the prompt")
    parser.add_argument("--gamma", type=int, default=None, help="the reply's γ (default: adaptive)")
    args = parser.parse_args()
    client = OpenAI(base_url=args.url, api_key="none", timeout=1800)
    model = client.models.list().data[0].id
    print(json.dumps(measure(client, model, long_prompt(args.url, model, args.tokens), args.reply_tokens, args.gamma)))


if __name__ == "__main__":
    main()
