"""The benchmarks' in-process Hugging Face baselines, each through its command on tiny models: assisted generation
(`specdec bench`), a padded batch (`--concurrency`) and prompt lookup (`--workloads`). They run off the initial
thread (`off_the_initial_thread`), which took no keyword arguments from 77a1228 until these tests: every one of them
failed, unseen."""

from __future__ import annotations

import json

from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.main import main

TINY = ["--device", "cpu", "--draft-model", TINY_DRAFT, "--target-model", TINY_TARGET, "--max-new-tokens", "6",
        "--limit-prompts", "1"]


def rows(tmp_path, *flags: str) -> dict:
    output = tmp_path / "out.json"
    assert main(["bench", *flags, *TINY, "--output", str(output)]) == 0
    return {r["config"]: r for r in json.loads(output.read_text())["rows"]}


def test_hugging_face_assisted_generation_runs_beside_ours_and_says_the_same(tmp_path):
    hf = rows(tmp_path, "--gammas", "1")["hf-assisted"]
    assert hf["tokens"] > 0 and hf["tokens_per_s"] > 0 and hf["identical_to_target_only"]


def test_hugging_face_batched_generate_runs_at_each_level(tmp_path):
    hf = rows(tmp_path, "--concurrency", "2")["hf-generate-batched"]
    assert hf["users"] == 2 and hf["tokens_per_s"] > 0


def test_hugging_face_prompt_lookup_runs_beside_our_proposers(tmp_path):
    hf = rows(tmp_path, "--workloads", "code")["hf-prompt-lookup"]
    assert hf["tokens_per_s"] > 0 and hf["same_as_target_only"]
