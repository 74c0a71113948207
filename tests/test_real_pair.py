"""The packaged Qwen2.5-Coder 0.5B/1.5B pair end to end (slow: run with `pytest -m slow`)."""

from __future__ import annotations

import pytest

from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack, StackOptions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_stack():
    with EmbeddedStack(StackOptions()) as running:
        yield running


@pytest.mark.parametrize("prompt", ["def is_prime(n):\n", "The three laws of thermodynamics are"])
def test_real_pair_greedy_equals_target_only(real_stack, prompt):
    baseline = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=0))
    for gamma in (1, 3, 5, None):
        result = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=gamma))
        assert result.token_ids == baseline.token_ids, f"γ={gamma} diverged from target-only"
        assert result.stats["accepted_tokens"] > 0


@pytest.mark.parametrize("proposer", ["model", "hybrid"])
def test_real_pair_greedy_with_overlap_equals_target_only(real_stack, proposer):
    """Drafting during verification, forced on: branches are drafted and some hit; the output is unchanged."""
    prompt = "def merge_sorted(a, b):\n"
    baseline = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=0))
    result = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, proposer=proposer,
                                                        overlap="on"))
    assert result.token_ids == baseline.token_ids
    if proposer == "model":
        assert result.stats["overlap_hits"] > 0


def test_real_pair_greedy_logprobs_do_not_change_under_speculation(real_stack):
    """Within 1e-5 of γ = 0 (they are the same bits on a row-invariant path), for fixed and adaptive γ."""
    prompt = "def quicksort(items):\n"
    baseline = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=0, top_logprobs=5))
    assert len(baseline.logprobs) == 32
    for gamma in (3, None):
        result = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=gamma,
                                                            top_logprobs=5))
        assert result.token_ids == baseline.token_ids and result.stats["accepted_tokens"] > 0
        for got, want in zip(result.logprobs, baseline.logprobs, strict=True):
            assert abs(got.logprob - want.logprob) <= 1e-5 and list(got.top_ids) == list(want.top_ids)
            assert max(abs(a - b) for a, b in zip(got.top_logprobs, want.top_logprobs)) <= 1e-5


def test_real_pair_scores_a_generation_with_its_own_logprobs(real_stack):
    """Scoring prompt + a greedy speculative generation (prompt_logprobs, OpenAI's echo) returns the numbers the
    generation reported for its tokens, to the bit, and the prompt's first token has none."""
    made = generate(real_stack.endpoint, make_request(prompt="def binary_search(xs, x):\n", max_new_tokens=32,
                                                      top_logprobs=3))
    assert made.stats["accepted_tokens"] > 0
    prompt = generate(real_stack.endpoint, make_request(prompt="def binary_search(xs, x):\n", max_new_tokens=1,
                                                        gamma=0, prompt_top=0)).prompt_token_ids
    scored = generate(real_stack.endpoint, make_request(prompt_token_ids=prompt + made.token_ids, max_new_tokens=1,
                                                        gamma=0, prompt_top=3))
    assert len(scored.prompt_logprobs) == len(prompt) + 31
    assert scored.prompt_logprobs[len(prompt) - 1:] == made.logprobs


def test_real_pair_structured_output_and_a_forced_tool_call(real_stack):
    """On the packaged vocabulary (151,936 ids, a multiple of 32; <tool_call> an added token that is not special):
    a JSON-schema reply and a forced tool call parse, the same with speculation as target-only."""
    import json

    from specdec.http.tool_calls import forcing_grammar, parse_calls, read_tools

    tools = read_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}])
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                          "age": {"type": "integer"}}, "required": ["name", "age"],
                         "additionalProperties": False})
    for kind, value, prompt in (("json_schema", schema, "A person as JSON: "),
                                ("lark", forcing_grammar(tools, "get_weather", False), "What is the weather in Paris?\n")):
        texts = []
        for gamma in (0, None):
            request = make_request(prompt=prompt, max_new_tokens=64, gamma=gamma)
            setattr(request.constraint, kind, value)
            texts.append(generate(real_stack.endpoint, request).text)
        assert texts[0] == texts[1], texts
        if kind == "json_schema":
            assert set(json.loads(texts[0])) == {"name", "age"}
        else:
            assert [call["function"]["name"] for call in parse_calls(texts[0], tools)[1]] == ["get_weather"], texts[0]


def test_real_pair_calls_a_tool_on_auto(real_stack):
    """With the tool in the chat template's prompt and nothing forced, the packaged coder answers a weather question
    with the call as its one Markdown json block (not in <tool_call> tags): read as the call, the same with
    speculation as target-only."""
    from specdec import weights
    from specdec.http.tool_calls import parse_calls, read_tools
    from specdec.weights.sources import load_tokenizer

    spec = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    tokenizer = load_tokenizer(weights.resolve("packaged:target"))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What's the weather in Paris right now?"}],
                                           tools=[spec], add_generation_prompt=True, tokenize=True, return_dict=False)
    texts = [generate(real_stack.endpoint, make_request(prompt_token_ids=list(prompt), max_new_tokens=100,
                                                        gamma=gamma)).text for gamma in (0, None)]
    assert texts[0] == texts[1], texts
    content, calls = parse_calls(texts[0], read_tools([spec]))
    assert content is None and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [("get_weather", '{"city": "Paris"}')], texts[0]


def test_real_pair_fills_in_the_middle_and_stops_at_its_end_of_text(real_stack):
    """A fill-in-the-middle prompt: the middle ends with <|endoftext|>, an end-of-generation token the GGUF's
    config does not name (it names <|im_end|>), so the generation stops there; the same with speculation."""
    from specdec.http.infill import infill_prompt
    from specdec.weights import resolve
    from specdec.weights.sources import load_tokenizer

    tokenizer = load_tokenizer(resolve("packaged:target"))
    ids = infill_prompt(tokenizer, 'def is_prime(n: int) -> bool:\n    """Whether n is a prime number."""\n',
                        "\n\n\nprint([p for p in range(20) if is_prime(p)])\n")
    results = [generate(real_stack.endpoint, make_request(prompt_token_ids=ids, max_new_tokens=96, gamma=gamma))
               for gamma in (0, None)]
    assert results[0].token_ids == results[1].token_ids
    assert len(results[0].token_ids) < 96 and results[0].text.rstrip().endswith("return True"), results[0].text


def test_real_target_gguf_path_tracks_fp32_on_the_same_weights():
    """The packaged target on the exact gguf path against the fp32 path on the dequantized weights:
    logits within float32 summation noise, the same greedy choice at every position."""
    import torch

    from specdec import weights
    from specdec.engine.models import load_model
    from specdec.engine.runner import Step
    from specdec.weights.sources import load_tokenizer

    spec = weights.resolve("packaged:target")
    ids = load_tokenizer(spec).encode("def binary_search(items, target):\n    lo, hi = 0, len(items)\n")
    logits = []
    for dtype in ("gguf", "float32"):
        loaded = load_model(spec, "cpu", dtype)
        assert loaded.choice.path == ("gguf" if dtype == "gguf" else "fp32")
        logits.append(loaded.runner.forward([Step(loaded.runner.new_cache(), ids, logits=len(ids))])[0])
        del loaded
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-3, atol=1e-3)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))


def benchmark_continuations(spec: str, dtype: str) -> tuple[list[list[int]], list[list[int]]]:
    """The benchmark prompts' tokens and `spec`'s greedy continuations of them on `dtype`, 64 tokens each (as
    the benchmark measures agreement)."""
    from specdec.engine.models import load_model
    from specdec.tools.bench.paths import greedy
    from specdec.tools.bench.speed import load_prompts
    from specdec.weights.sources import load_tokenizer

    tokenizer = load_tokenizer(spec)
    prompts = [tokenizer.encode(p["prompt"], add_special_tokens=False) for p in load_prompts("", 0)]
    runner = load_model(spec, "cpu", dtype).runner
    return prompts, [greedy(runner, ids, 64) for ids in prompts]


def agreement(runner, prompts: list[list[int]], continuations: list[list[int]]) -> float:
    """The share of the continuations' tokens that are `runner`'s argmax, teacher-forced along them."""
    import torch

    from specdec.engine.runner import Step

    same = total = 0
    for ids, continuation in zip(prompts, continuations):
        logits = runner.forward([Step(runner.new_cache(), ids + continuation[:-1], logits=len(continuation))])[0]
        same += int((logits.argmax(-1) == torch.tensor(continuation)).sum())
        total += len(continuation)
    return same / total


def test_real_target_integer_path_agrees_with_the_exact_one():
    """The rule that makes gguf-q8 the default (docs/PERFORMANCE.md): along the exact path's greedy
    continuations of the benchmark prompts, its argmax agrees at ≥ 98% of positions."""
    from specdec import weights
    from specdec.engine.models import load_model

    spec = weights.resolve("packaged:target")
    prompts, continuations = benchmark_continuations(spec, "gguf")
    rate = agreement(load_model(spec, "cpu", "gguf-q8").runner, prompts, continuations)
    assert rate >= 0.98, f"agreement {rate:.3f}"


def test_real_draft_in_q4_0_agrees_with_the_target_as_its_file_does():
    """The rule behind `--draft-weights auto` (docs/PERFORMANCE.md, "A draft in 4 bits"): along the target's
    greedy continuations of the benchmark prompts, the draft requantized to Q4_0 (its output layer cut as the
    draft service cuts it) picks the target's token as often as the draft as shipped, within 1%."""
    from specdec import weights
    from specdec.engine.models import draft_vocabulary, load_model

    prompts, continuations = benchmark_continuations(weights.resolve("packaged:target"), "gguf-q8")
    rates = {}
    for setting in ("as-shipped", "q4_0"):
        draft = load_model(weights.resolve("packaged:draft"), "cpu", "gguf-q8", draft_weights=setting)
        assert draft.runner.limit_vocabulary(draft_vocabulary(draft.vocab_size, draft.eos_token_ids))
        rates[setting] = agreement(draft.runner, prompts, continuations)
        del draft
    assert rates["q4_0"] >= rates["as-shipped"] - 0.01, rates
