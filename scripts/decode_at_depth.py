"""Decoding after a long prompt, target-only against adaptive, through a running server: an agent's regime, where
a verify's attention costs most.

The prompt (this repository's code, or `--prose`: docs/PERFORMANCE.md, by the server's tokenizer, its first N
tokens) is sent once target-only and once adaptive, so that both services keep it cached; then each mode
generates 128 tokens (greedy, `ignore_eos`, streamed), alternating, `--repeats` times. Prints one JSON line: each
mode's tokens/s after its first token, and whether their outputs were identical. Start a server first, with a
context that holds the prompt:

    .venv/bin/specdec serve --http-port 8088 --context 8192 &
    .venv/bin/python scripts/decode_at_depth.py --tokens 5000 --prose --proposer model

docs/PERFORMANCE.md, "Attention at depth in the cost profile", has its figures.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from long_prompt_beside import long_prompt
from openai import OpenAI

PROSE = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
NEW_TOKENS = 128


def prose_prompt(url: str, model: str, tokens: int) -> list[int]:
    """The first `tokens` ids of docs/PERFORMANCE.md, by the server's `/tokenize`."""
    body = json.dumps({"model": model, "prompt": PROSE.read_text()}).encode()
    request = urllib.request.Request(url.removesuffix("/v1") + "/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)["tokens"][:tokens]


def generate(client: OpenAI, model: str, prompt: list[int], extra: dict) -> tuple[float, str]:
    """Tokens/s after the first token, and the text, of one greedy 128-token completion."""
    first, text = None, ""
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True, **extra})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter()
            text += chunk.choices[0].text
    return (NEW_TOKENS - 1) / (time.perf_counter() - first), text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8088/v1")
    parser.add_argument("--tokens", type=int, default=5000, help="the prompt's length")
    parser.add_argument("--prose", action="store_true", help="docs/PERFORMANCE.md instead of this repository's code")
    parser.add_argument("--proposer", default=None, help="adaptive's proposer (default: the server's)")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    client = OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id
    prompt = (prose_prompt if args.prose else long_prompt)(args.url, model, args.tokens)
    modes = {"target-only": {"gamma": 0}, "adaptive": {"proposer": args.proposer} if args.proposer else {}}
    for extra in modes.values():  # both services prefill the prompt and keep it
        generate(client, model, prompt, extra)
    rates, texts = {name: [] for name in modes}, {}
    for r in range(args.repeats):
        for name in (modes if r % 2 == 0 else reversed(modes)):
            rate, text = generate(client, model, prompt, modes[name])
            rates[name].append(round(rate, 2))
            texts.setdefault(name, set()).add(text)
    print(json.dumps({"prompt_tokens": len(prompt), **rates,
                      "identical": len(texts["target-only"] | texts["adaptive"]) == 1}))


if __name__ == "__main__":
    main()
