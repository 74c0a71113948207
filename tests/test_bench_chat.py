"""`specdec bench --turns` end to end on tiny models: each later turn takes the earlier conversation from a
kept cache, and every reply is the one computed without kept caches."""

from __future__ import annotations

import json

from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.main import main

LONG = ",ctx=4096"  # the chat's system prompt is 600-odd bytes: past the tiny models' default context


def test_chat_bench_reuses_each_turns_conversation_and_changes_no_reply(tmp_path):
    output = tmp_path / "chat.json"
    assert main(["bench", "--turns", "2", "--device", "cpu", "--draft-model", TINY_DRAFT + LONG, "--target-model",
                 TINY_TARGET + LONG, "--max-new-tokens", "8", "--output", str(output)]) == 0
    first, second = json.loads(output.read_text())["rows"]
    assert first["cached_tokens"] == 0 and second["cached_tokens"] >= first["prompt_tokens"]
    assert first["same_reply"] and second["same_reply"]
