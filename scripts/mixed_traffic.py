"""Does speculation survive mixed traffic? A few requests of other kinds, then greedy code completions.

One orchestrator learns its γ prior from every request it serves. This sends what a user's first minutes held (a
chat, a streamed one, a structured output, hot sampled chats with n = 3, a tool call, a scored prompt), then greedy
code completions, each twice, alternating: adaptive with the draft model, and target-only (`gamma: 0`). It prints
tokens/s of both and their ratio. Start a server first (the packaged pair, embedded):

    .venv/bin/specdec serve --http-port 8088 &
    .venv/bin/python scripts/mixed_traffic.py --url http://127.0.0.1:8088/v1

Use a fresh server each run: what it measures is what the server learned from this traffic.
"""

from __future__ import annotations

import argparse
import time

from openai import OpenAI

CODE = ["def quicksort(arr):", "def binary_search(a, x):", "import numpy as np\n\ndef softmax(x):",
        "class LinkedList:\n    def __init__(self):"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
POEM = "Write a short poem about the sea."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def hot_chats(client: OpenAI, model: str, count: int, seed: int = 0) -> None:
    """`count` sampled chats at temperature 1, 3 choices each."""
    for i in range(count):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": POEM}], max_tokens=32, n=3,
                                       temperature=1.0, seed=seed + i)


def other_traffic(client: OpenAI, model: str) -> None:
    """The requests before the code completions, as a user's first minutes sent them."""
    chat = client.chat.completions.create
    chat(model=model, messages=[{"role": "user", "content": "Write a Python function that reverses a string."}],
         max_tokens=80, temperature=0)
    for _ in chat(model=model, messages=[{"role": "user", "content": "Say hi in 3 languages."}], max_tokens=40,
                  stream=True):
        pass
    chat(model=model, messages=[{"role": "user", "content": "Give me a person as JSON."}], max_tokens=60,
         response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}})
    hot_chats(client, model, 3)
    chat(model=model, messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=TOOLS,
         max_tokens=60, temperature=0)
    client.completions.create(model=model, prompt="def fib(n):", max_tokens=16, temperature=0, logprobs=2, echo=True)


def completion_rate(client: OpenAI, model: str, prompt: str, tokens: int, **extra) -> tuple[float, dict]:
    began = time.perf_counter()
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0,
                                      extra_body={"ignore_eos": True, **extra})
    return reply.usage.completion_tokens / (time.perf_counter() - began), reply.usage.model_extra["speculation"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8088/v1")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--hot-between", type=int, default=0,
                        help="hot sampled chats before each completion too (traffic that keeps mixing)")
    args = parser.parse_args()
    client = OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id
    other_traffic(client, model)
    rates = {"adaptive": [], "target-only": []}
    for i, prompt in enumerate(CODE * 2):
        for policy, extra in (("adaptive", {"proposer": "model"}), ("target-only", {"gamma": 0})):
            hot_chats(client, model, args.hot_between, seed=10 * i)
            rate, spec = completion_rate(client, model, prompt, args.max_tokens, **extra)
            rates[policy].append(rate)
            print(f"{policy:12s} {rate:6.1f} tok/s  drafted {spec['drafted']:3d} accepted {spec['accepted']:3d} "
                  f"rounds {spec['rounds']:3d}  {prompt.splitlines()[0]!r}")
    mean = {policy: sum(r) / len(r) for policy, r in rates.items()}
    print(f"adaptive {mean['adaptive']:.1f} tok/s, target-only {mean['target-only']:.1f} tok/s: "
          f"{mean['adaptive'] / mean['target-only']:.2f}x")


if __name__ == "__main__":
    main()
