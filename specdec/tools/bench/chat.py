"""`specdec bench --turns N`: a chat of N turns with ended sessions' caches kept, and without.

Every turn resends the whole conversation: a system prompt, the earlier questions and answers, and a
new question. With the services keeping ended sessions' KV caches (`--prefix-cache-mb`, the server
default), a turn computes only what follows the last turn's reply; without, all of it. Two stacks in
turn, the same conversation, greedy: per turn the prompt's length, the part taken from a cache, the
time to the first token and the whole reply's, and whether the replies are the same tokens (they must
be: a kept cache holds the bits a prefill computes).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tqdm import tqdm

from specdec import weights
from specdec.cli.client import generate, make_request
from specdec.tools.bench.speed import save_rows, service_infos, warm_up

SYSTEM = ("You are a coding assistant inside an editor. You answer with short, correct Python and a sentence of "
          "explanation. The project is a command-line tool that reads CSV files of sales records (date, region, "
          "product, units, unit price), validates them, and prints monthly totals per region. Follow PEP 8, use "
          "type hints and the standard library only, prefer pathlib and dataclasses, raise ValueError with a clear "
          "message on bad input, and keep functions short. When you change code, show only the changed function.")
QUESTIONS = ("Write a dataclass for one sales record, with a classmethod that parses a CSV row.",
             "Now write a function that reads a CSV file into a list of those records, skipping the header.",
             "Add validation: units must be a positive integer and the date must be ISO 8601.",
             "Write the function that sums revenue per (month, region).",
             "Print the totals as an aligned table, months in order.",
             "Add a --region flag with argparse that filters the table.")


@dataclasses.dataclass
class Turn:
    prompt_tokens: int
    cached_tokens: int
    first_token_s: float
    reply_s: float
    tokens: list[int]
    text: str


def ask(endpoint: str, ids: list[int], max_new_tokens: int) -> Turn:
    """One greedy generation, timed from the request to its first token and to its end."""
    out = generate(endpoint, make_request(prompt_token_ids=ids, max_new_tokens=max_new_tokens), timeout=600)
    return Turn(len(ids), out.stats["cached_prompt_tokens"], out.first_token_s, out.seconds, out.token_ids, out.text)


def converse(endpoint: str, tokenizer, turns: int, max_new_tokens: int) -> list[Turn]:
    messages, out = [{"role": "system", "content": SYSTEM}], []
    for question in tqdm([QUESTIONS[i % len(QUESTIONS)] for i in range(turns)], desc="turns", leave=False):
        messages.append({"role": "user", "content": question})
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
        out.append(ask(endpoint, ids, max_new_tokens))
        messages.append({"role": "assistant", "content": out[-1].text})
    return out


def run_chat(args: argparse.Namespace) -> int:
    from specdec.cli.options import stack_options
    from specdec.launch.stack import EmbeddedStack
    from specdec.runtime.model_service_config import ModelServiceConfig
    from specdec.weights.sources import load_tokenizer

    tokenizer = load_tokenizer(weights.resolve(args.target_model))
    kept_mb = args.prefix_cache_mb or ModelServiceConfig.prefix_cache_mb
    played: dict[int, list[Turn]] = {}
    for mb in (0, kept_mb):
        base = stack_options(args)
        with EmbeddedStack(dataclasses.replace(base, service=dataclasses.replace(base.service,
                                                                                 prefix_cache_mb=mb))) as stack:
            _, info = service_infos(stack)
            warm_up(stack.endpoint, "def fib(n):", args.gamma_max)
            played[mb] = converse(stack.endpoint, tokenizer, args.turns, args.max_new_tokens)
    rows = []
    for i, (cold, kept) in enumerate(zip(played[0], played[kept_mb], strict=True), 1):
        rows.append({"turn": i, "prompt_tokens": kept.prompt_tokens, "cached_tokens": kept.cached_tokens,
                     "first_token_s_cold": round(cold.first_token_s, 3), "first_token_s": round(kept.first_token_s, 3),
                     "reply_s_cold": round(cold.reply_s, 3), "reply_s": round(kept.reply_s, 3),
                     "reply_tokens": len(kept.tokens), "same_reply": kept.tokens == cold.tokens})
    print(f"machine: {info.hardware}; path {info.compute_path} ({info.kernel}); {args.max_new_tokens} tokens a "
          f"reply at most, greedy, adaptive γ; caches kept: {kept_mb} MiB a service against none")
    print("turn | prompt tokens | from a cache | first token s (none kept) | first token s | reply s (none kept) "
          "| reply s | same reply")
    for r in rows:
        print(" | ".join(str(r[k]) for k in ("turn", "prompt_tokens", "cached_tokens", "first_token_s_cold",
                                             "first_token_s", "reply_s_cold", "reply_s", "same_reply")))
    save_rows(args.output, info, args.max_new_tokens, rows, plot)
    return 0 if all(r["same_reply"] for r in rows) else 1


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = [r["turn"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([t - 0.2 for t in turns], [r["first_token_s_cold"] for r in rows], 0.4, label="no caches kept")
    ax.bar([t + 0.2 for t in turns], [r["first_token_s"] for r in rows], 0.4, label="ended sessions' caches kept")
    ax.set(xlabel="turn", ylabel="time to first token (s)", title="a chat: every turn resends the conversation")
    ax.set_xticks(turns)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
