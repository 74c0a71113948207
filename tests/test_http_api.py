"""The OpenAI-compatible HTTP API through the official `openai` client, against a real
`specdec serve --http-port` on loopback: what each field does, under speculation (bad input and faults:
tests/test_http_faults.py)."""

from __future__ import annotations

import json
import re

import httpx2 as httpx
import openai
import pytest
from conftest import TINY_TARGET, Serve

from protos import specdec_pb2 as pb
from specdec.cli.client import generate, make_request
from specdec.weights.sources import build_byte_tokenizer

MODEL = TINY_TARGET
PROMPT = "def fib(n):"
MESSAGES = [{"role": "system", "content": "You write code."}, {"role": "user", "content": "fib in Python"}]


def grpc_text(serve: Serve, **kw) -> tuple[str, list[int], list[pb.TokenLogprob]]:
    result = generate(serve.grpc, make_request(**kw), timeout=60)
    return result.text, result.token_ids, result.logprobs


def test_served_names():
    from specdec.http.app import served_name

    assert served_name("packaged:target") == "qwen2.5-coder-1.5b-instruct"
    assert served_name("/home/u/.cache/specdec/qwen2.5-coder-1.5b-instruct/bundle") == "qwen2.5-coder-1.5b-instruct"
    assert served_name("/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf") == "Qwen2.5-7B-Instruct-Q4_K_M"
    assert served_name("/models/llama/") == "llama" and served_name("tiny:seed=0") == "tiny:seed=0"


def test_models(serve):
    client = serve.client()
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_completions_plain_and_streamed_equal_the_grpc_text(serve):
    client = serve.client()
    want, _, _ = grpc_text(serve, prompt=PROMPT, max_new_tokens=40)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)
    assert reply.choices[0].text == want and reply.choices[0].finish_reason == "length"
    assert (reply.usage.completion_tokens, reply.usage.prompt_tokens) == (40, len(PROMPT))
    speculation = reply.usage.model_extra["speculation"]
    assert speculation["accepted"] <= speculation["drafted"] and speculation["rounds"] >= 1
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    by_ids = client.completions.create(model=MODEL, prompt=list(PROMPT.encode()), max_tokens=40, temperature=0)
    assert by_ids.choices[0].text == want
    lookup = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                       extra_body={"proposer": "ngram", "gamma": 3})
    assert lookup.choices[0].text == want


def test_sampling_fields_and_stop_reach_the_generation(serve):
    client = serve.client()
    # A seeded sample is reproducible for a given sequence of proposals: the draft model's at a fixed γ
    # (lookups depend on what earlier requests left in the server's memory).
    want, _, _ = grpc_text(serve, prompt=PROMPT, max_new_tokens=30, temperature=0.8, top_k=20, top_p=0.9, seed=5,
                           gamma=3, proposer="model")
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0.8, top_p=0.9, seed=5,
                                      extra_body={"top_k": 20, "gamma": 3, "proposer": "model"})
    assert reply.choices[0].text == want
    stop = next(c for c in want[3:] if c.isascii() and c.isprintable() and not c.isspace())  # random bytes
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0.8, top_p=0.9, seed=5,
                                        stop=[f"<never {i}>" for i in range(4)] + [stop],  # more than OpenAI's 4
                                        extra_body={"top_k": 20, "gamma": 3, "proposer": "model"})
    assert want.startswith(stopped.choices[0].text) and stop not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"


def test_chat_plain_and_streamed(serve):
    client = serve.client()
    prompt_ids = build_byte_tokenizer().apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    want, _, _ = grpc_text(serve, prompt_token_ids=list(prompt_ids), max_new_tokens=32)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=32, temperature=0)
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content == want
    assert reply.usage.prompt_tokens == len(prompt_ids)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_repeated_conversation_reports_its_prompt_as_cached(serve):
    """The last request's kept cache holds the whole prompt: all of it but the token that starts the reply is
    taken (`usage.prompt_tokens_details.cached_tokens`), and the reply is the same."""
    client = serve.client()
    replies = [client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
               for _ in range(2)]
    assert replies[1].choices[0].message.content == replies[0].choices[0].message.content
    assert replies[1].usage.prompt_tokens_details.cached_tokens == replies[1].usage.prompt_tokens - 1
    salted = [client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                             extra_body={"cache_salt": "tenant-x"}) for _ in range(2)]
    assert [r.usage.prompt_tokens_details.cached_tokens for r in salted] == [0, salted[1].usage.prompt_tokens - 1], \
        "a salt shares only with its own requests"
    assert salted[1].choices[0].message.content == replies[0].choices[0].message.content


def test_logprobs_equal_with_speculation_on_and_off(serve):
    """Greedy: the same numbers (float32, exactly) under γ = 0, γ = 4 and adaptive, streamed or not, and
    the numbers gRPC returns."""
    client = serve.client()

    def chat_logprobs(**kw):
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
                                               logprobs=True, top_logprobs=5, **kw)
        return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for t in reply.choices[0].logprobs.content]

    off = chat_logprobs(extra_body={"gamma": 0})
    assert len(off) == 24 and all(len(alternatives) == 5 for _, _, alternatives in off)
    assert chat_logprobs(extra_body={"gamma": 4}) == off
    assert chat_logprobs() == off
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
                                            logprobs=True, top_logprobs=5, stream=True, extra_body={"gamma": 4})
    streamed = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == off
    _, _, via_grpc = grpc_text(serve, prompt=PROMPT, max_new_tokens=16, top_logprobs=3, gamma=4)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, logprobs=3,
                                      extra_body={"gamma": 0})
    assert reply.choices[0].logprobs.token_logprobs == [lp.logprob for lp in via_grpc]
    tokenizer = build_byte_tokenizer()
    for got, want in zip(reply.choices[0].logprobs.top_logprobs, via_grpc, strict=True):
        expected = {}
        for token, value in zip(want.top_ids, want.top_logprobs):  # texts may collide: the likeliest stays
            expected.setdefault(tokenizer.decode([token]), value)
        assert got == expected


def test_penalties_and_bias_equal_the_grpc_generation_under_speculation(serve):
    """OpenAI's presence_penalty, frequency_penalty and logit_bias and the repetition_penalty extension reach
    the generation: γ = 3 through HTTP gives the tokens target-only gRPC gives with the same processing."""
    from test_processing import PROCESSING, processed_request

    want = generate(serve.grpc, processed_request(prompt=PROMPT, max_new_tokens=24, gamma=0), timeout=60).text
    plain = generate(serve.grpc, make_request(prompt=PROMPT, max_new_tokens=24, gamma=0), timeout=60).text
    assert want != plain
    for stream in (False, True):
        reply = serve.client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=stream,
            presence_penalty=PROCESSING["presence_penalty"], frequency_penalty=PROCESSING["frequency_penalty"],
            logit_bias={str(t): v for t, v in PROCESSING["logit_bias"].items()},
            extra_body={"repetition_penalty": PROCESSING["repetition_penalty"], "gamma": 3, "proposer": "model"})
        text = "".join(c.choices[0].text for c in reply if c.choices) if stream else reply.choices[0].text
        assert text == want


def test_n_choices_through_the_official_client(serve):
    """n = 2 greedy (the stack's services hold 2 sessions): two choices, each the n = 1 text, plain and
    streamed (chunks tell the choices apart by index, each with its finish reason), usage counting every
    choice's tokens; chat with n = 2 and a seed: choice 0 is the n = 1 reply for that seed."""
    client = serve.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"gamma": 2})
    one = client.completions.create(**args).choices[0].text
    reply = client.completions.create(n=2, **args)
    assert [c.index for c in reply.choices] == [0, 1] and {c.text for c in reply.choices} == {one}
    assert reply.usage.completion_tokens == 24
    chunks = list(client.completions.create(n=2, stream=True, **args))
    texts, finishes = {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: one, 1: one} and finishes == {0: "length", 1: "length"}
    chat = dict(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=1.0, seed=7,
                extra_body={"gamma": 2, "proposer": "model", "overlap": "off"})  # one trajectory per seed
    single = client.chat.completions.create(**chat).choices[0].message.content
    pair = client.chat.completions.create(n=2, **chat).choices
    assert [c.index for c in pair] == [0, 1] and pair[0].message.content == single


def test_best_of_returns_the_likeliest_choices_per_token(serve):
    """best_of = 2, n = 1, sampled with a seed: the one choice is whichever of the n = 2 choices for that seed
    has the higher mean logprob per token (the second for one prompt, the first for the other), without
    logprobs unless asked for; usage counts both; several prompts each get their own best. best_of < n, or
    streamed, is a 400."""
    client = serve.client()
    args = dict(model=MODEL, max_tokens=10, temperature=1.0, seed=4)  # coupled: one output per seed, however drafted

    def best(prompt: str) -> tuple[str, int]:
        pair = client.completions.create(prompt=prompt, n=2, logprobs=0, **args)
        means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in pair.choices]
        assert pair.choices[0].text != pair.choices[1].text and means[0] != means[1], "want two different choices"
        return pair.choices[means.index(max(means))].text, means.index(max(means))

    (want, first), (other_want, other_first) = best(PROMPT), best("x = ")
    assert (first, other_first) == (1, 0), "want the best to be either choice"
    reply = client.completions.create(prompt=PROMPT, best_of=2, **args)
    assert [(c.index, c.text, c.logprobs) for c in reply.choices] == [(0, want, None)]
    assert reply.usage.completion_tokens == 20
    with_logprobs = client.completions.create(prompt=PROMPT, best_of=2, logprobs=1, **args).choices
    assert len(with_logprobs) == 1 and with_logprobs[0].text == want and len(with_logprobs[0].logprobs.tokens) == 10
    both = client.completions.create(prompt=[PROMPT, "x = "], best_of=2, **args)
    assert [(c.index, c.text) for c in both.choices] == [(0, want), (1, other_want)]
    for extra, message in [({"n": 2, "best_of": 1}, "best_of must be at least n (2)"),
                           ({"best_of": 2, "stream": True}, "cannot be streamed"),
                           ({"best_of": 9}, "best_of")]:
        refused = httpx.post(serve.base_url + "/completions", timeout=30, json={"model": MODEL, "prompt": "x", **extra})
        assert refused.status_code == 400 and message in refused.json()["error"]["message"], refused.text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_predicted_output_is_drafted_from_and_counted(serve, stream):
    """OpenAI's `prediction` (chat and, as an extension, completions): the reply is target-only's, drafted from
    the prediction (the reply itself, or with a letter changed), and usage's completion_tokens_details count the
    prediction's accepted and rejected tokens. (The tiny model is biased to lowercase letters, so that its text
    and its tokens say the same.) Counted at a fixed γ with prompt lookup, where no measured cost sets how long
    a round is; with the draft model beside it, adaptive, only its use."""
    client = serve.client()
    letters = {str(t): 100 for t in range(ord("a"), ord("z") + 1)}
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, logit_bias=letters)
    base = client.completions.create(**args, extra_body={"gamma": 0}).choices[0].text
    assert re.fullmatch("[a-z]{40}", base)

    def reply(prediction: str, salt: str, **extra):
        body = {"prediction": {"type": "content", "content": prediction}, "cache_salt": salt, **extra}
        if not stream:
            answer = client.completions.create(**args, extra_body=body)
            return answer.choices[0].text, answer.usage.completion_tokens_details
        chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True},
                                                extra_body=body))
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens_details

    text, details = reply(base, f"exact-{stream}", proposer="ngram", gamma=6)
    assert text == base and details.accepted_prediction_tokens == 34 and details.rejected_prediction_tokens == 0
    text, details = reply(base[:10] + "#" + base[11:], f"edited-{stream}", proposer="ngram", gamma=6)
    assert text == base and details.accepted_prediction_tokens >= 25 and details.rejected_prediction_tokens >= 1
    text, details = reply(base, f"model-{stream}", proposer="model")
    assert text == base and details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens == 0
    chat = dict(model=MODEL, messages=MESSAGES, max_tokens=30, temperature=0, logit_bias=letters)
    want = client.chat.completions.create(**chat).choices[0].message.content
    predicted = client.chat.completions.create(**chat, prediction={"type": "content", "content": [
        {"type": "text", "text": want}]}, extra_body={"cache_salt": f"chat-{stream}", "proposer": "ngram", "gamma": 6})
    assert predicted.choices[0].message.content == want
    assert predicted.usage.completion_tokens_details.accepted_prediction_tokens >= 20


def test_echo_puts_the_prompt_and_its_logprobs_before_the_completion(serve):
    """`echo`: the prompt's text, then the completion's; with `logprobs`, the prompt's tokens (the first
    with none) before the completion's, whose numbers are those of a reply without echo; streamed alike;
    for every choice of n."""
    client = serve.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=2, extra_body={"gamma": 3})
    plain = client.completions.create(**args).choices[0]
    echoed = client.completions.create(echo=True, **args)
    choice, prompt_tokens = echoed.choices[0], len(PROMPT)  # the byte tokenizer: a token a character
    assert choice.text == PROMPT + plain.text and echoed.usage.completion_tokens == 10
    logprobs = choice.logprobs
    assert logprobs.tokens == [*PROMPT, *plain.logprobs.tokens]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(isinstance(v, float) and v <= 0 for v in logprobs.token_logprobs[1:prompt_tokens])
    assert logprobs.token_logprobs[prompt_tokens:] == plain.logprobs.token_logprobs
    assert logprobs.top_logprobs[prompt_tokens:] == plain.logprobs.top_logprobs
    assert logprobs.text_offset == list(range(prompt_tokens + 10))
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                                     echo=True).choices[0].text == choice.text
    streamed, streamed_logprobs = "", []
    for chunk in client.completions.create(echo=True, stream=True, **args):
        for part in chunk.choices:
            streamed += part.text
            streamed_logprobs += part.logprobs.token_logprobs if part.logprobs else []
    assert streamed == choice.text and streamed_logprobs == logprobs.token_logprobs
    pair = client.completions.create(echo=True, n=2, **args).choices
    assert [c.text for c in pair] == [choice.text] * 2
    assert [c.logprobs.token_logprobs for c in pair] == [logprobs.token_logprobs] * 2


def test_prompt_logprobs_score_the_prompt_in_vllms_shape(serve):
    """vLLM's `prompt_logprobs: k`: each prompt token's log-probability, rank and text with the k likeliest (the
    first token None), per choice in completions and for the reply in chat; the numbers echo's are, to the bit;
    its k and the tokens' own `logprobs` k apart; refused when streamed."""
    client = serve.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    echoed = client.completions.create(echo=True, logprobs=3, **args).choices[0].logprobs
    reply = client.completions.create(logprobs=1, extra_body={"prompt_logprobs": 3}, **args)
    scores = reply.choices[0].prompt_logprobs
    assert len(scores) == len(PROMPT) and scores[0] is None  # the byte tokenizer: a token a character
    for position, (scored, token, alternatives) in enumerate(zip(scores[1:], PROMPT[1:], echoed.top_logprobs[1:]), 1):
        own = scored.pop(str(ord(token)))
        assert own["logprob"] == echoed.token_logprobs[position] and own["decoded_token"] == token
        likelier = sum(entry["logprob"] > own["logprob"] for entry in scored.values())
        assert own["rank"] == likelier + 1 if likelier < 3 else own["rank"] > 3
        listed = sorted([*scored.values(), *([own] if own["rank"] <= 3 else [])], key=lambda entry: entry["rank"])
        assert [entry["rank"] for entry in listed] == [1, 2, 3]
        assert listed[0]["logprob"] == max(alternatives.values())  # the likeliest, as echo lists it
        assert [entry["logprob"] for entry in listed] == sorted((entry["logprob"] for entry in listed), reverse=True)
    assert all(len(top) == 1 for top in reply.choices[0].logprobs.top_logprobs)
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 0})
    count = httpx.post(serve.base_url.removesuffix("/v1") + "/tokenize", timeout=30,
                       json={"model": MODEL, "messages": messages}).json()["count"]
    scored = chat.model_extra["prompt_logprobs"]
    assert len(scored) == count and scored[0] is None and all(len(entry) == 1 for entry in scored[1:])
    refused = httpx.post(serve.base_url + "/completions", timeout=30,
                         json={**args, "stream": True, "prompt_logprobs": 1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs", refused.text


def test_max_tokens_0_with_echo_scores_the_prompt_with_a_generations_numbers(serve):
    """The prompt scored alone (what evaluation harnesses ask): no completion, and each of its tokens
    the log-probability the target gave it when it generated that token (γ = 3), to the bit."""
    client = serve.client()
    _, ids, generated = grpc_text(serve, prompt=PROMPT, max_new_tokens=12, top_logprobs=3, gamma=3)
    prompt_ids = build_byte_tokenizer().encode(PROMPT, add_special_tokens=False)
    reply = client.completions.create(model=MODEL, prompt=[*prompt_ids, *ids], max_tokens=0, echo=True, logprobs=3,
                                      temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 0
    assert reply.usage.prompt_tokens == len(prompt_ids) + 12
    assert choice.text == build_byte_tokenizer().decode([*prompt_ids, *ids])
    assert choice.logprobs.token_logprobs[len(prompt_ids):] == [lp.logprob for lp in generated]
    assert len(choice.logprobs.tokens) == len(prompt_ids) + 12


def test_several_prompts_in_one_request_number_their_choices_prompt_by_prompt(serve):
    """A list of prompts: choice prompt · n + c is that prompt's choice c, each the reply the prompt gets alone,
    whole and streamed; usage counts every prompt once; six prompts on a server that runs two generations at
    once all come back (the batch runs at most what the orchestrator allows); a string beside token ids; echo and
    scoring per prompt."""
    client = serve.client()
    prompts = [PROMPT, "class Stack:", "import os", "x = [", "# sum a list", "while True:"]
    args = dict(model=MODEL, max_tokens=6, temperature=0, extra_body={"gamma": 2})
    alone = [client.completions.create(prompt=p, **args).choices[0].text for p in prompts]
    batch = client.completions.create(prompt=prompts, **args)
    assert [(c.index, c.text) for c in batch.choices] == list(enumerate(alone))
    assert batch.usage.prompt_tokens == sum(map(len, prompts)) and batch.usage.completion_tokens == 36
    pair = client.completions.create(prompt=prompts[:2], n=2, **args)
    assert [c.text for c in pair.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert pair.usage.prompt_tokens == len(prompts[0]) + len(prompts[1])
    texts: dict[int, str] = {}
    for chunk in client.completions.create(prompt=prompts[:3], stream=True, **args):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == dict(enumerate(alone[:3]))
    ids = [build_byte_tokenizer().encode(p, add_special_tokens=False) for p in prompts[:3]]
    mixed = client.completions.create(prompt=[prompts[0], ids[1]], **args)  # a string and ids: each its prompt
    assert [c.text for c in mixed.choices] == alone[:2]
    scored = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    for i, choice in enumerate(scored.choices):
        single = client.completions.create(model=MODEL, prompt=ids[i], max_tokens=0, echo=True, logprobs=1,
                                           temperature=0).choices[0]
        assert choice.text == prompts[i] and choice.logprobs.token_logprobs == single.logprobs.token_logprobs
        assert choice.logprobs.tokens == list(prompts[i])


def test_tokenize_and_detokenize(serve):
    """vLLM's routes: a prompt's ids as completions feed them, a conversation's as chat does (the count is the
    chat reply's prompt_tokens), and the text of ids back; a client's mistake is a 400 or 404."""
    post = lambda path, body: httpx.post(serve.base_url.removesuffix("/v1") + path, json={"model": MODEL, **body},
                                         timeout=30)
    reply = post("/tokenize", {"prompt": PROMPT}).json()
    assert reply["tokens"] == build_byte_tokenizer().encode(PROMPT, add_special_tokens=False)
    assert reply["count"] == len(PROMPT) and reply["max_model_len"] == 512
    chat = serve.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert post("/tokenize", {"messages": MESSAGES}).json()["count"] == chat.usage.prompt_tokens
    assert post("/detokenize", {"tokens": reply["tokens"]}).json() == {"prompt": PROMPT}
    for path, body, status, message in [("/tokenize", {}, 400, "exactly one of prompt and messages"),
                                        ("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, "exactly one"),
                                        ("/detokenize", {"tokens": [5, 10**6]}, 400, "outside the vocabulary"),
                                        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
                                        ("/detokenize", {"tokens": [5, True]}, 400, "tokens.1"),
                                        ("/tokenize", {"prompt": "x", "model": "gpt-4o"}, 404, "does not exist")]:
        refused = post(path, body)
        assert refused.status_code == status and message in refused.json()["error"]["message"], refused.text


SCHEMA = {"type": "object", "properties": {"name": {"enum": ["ada", "bob"]}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_reply_validates_under_speculation(serve, stream):
    """response_format json_schema through the official client: the reply parses and follows the schema,
    the same with speculation (γ = 3) as target-only; json_object gives an object; guided_regex matches."""
    client = serve.client()

    def text(**kw) -> str:
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=60, temperature=0,
                                               stream=stream, **kw)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        assert reply.choices[0].finish_reason == "stop"
        return reply.choices[0].message.content

    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    spec = text(response_format=schema, extra_body={"gamma": 3, "proposer": "model"})
    assert spec == text(response_format=schema, extra_body={"gamma": 0})
    value = json.loads(spec)
    assert set(value) == {"name", "ok"} and value["name"] in ("ada", "bob") and isinstance(value["ok"], bool)
    assert isinstance(json.loads(text(response_format={"type": "json_object"}, extra_body={"gamma": 3})), dict)
    assert re.fullmatch(r"[0-9]{2}:[0-9]{2}", text(extra_body={"guided_regex": r"[0-9]{2}:[0-9]{2}", "gamma": 2}))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_vllms_structured_output_fields_under_speculation(serve, stream):
    """vLLM's guided_json (a schema as an object or as JSON text), guided_choice, and its newer
    structured_outputs (json, choice, regex, grammar), through the official client's extra_body: each reply
    follows its constraint, the same with speculation (γ = 3) as target-only."""
    client = serve.client()

    def text(extra: dict) -> str:
        reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=60, temperature=0, stream=stream,
                                          extra_body=extra)
        if stream:
            return "".join(c.choices[0].text for c in reply if c.choices)
        assert reply.choices[0].finish_reason == "stop", reply
        return reply.choices[0].text

    options = ["yes", 'a "quoted" no', "maybe\nnot"]
    for extra, check in [({"guided_json": SCHEMA}, lambda t: json.loads(t)["name"] in ("ada", "bob")),
                         ({"guided_json": json.dumps(SCHEMA)}, lambda t: json.loads(t)["name"] in ("ada", "bob")),
                         ({"structured_outputs": {"json": SCHEMA}}, lambda t: set(json.loads(t)) == {"name", "ok"}),
                         ({"guided_choice": options}, lambda t: t in options),
                         ({"structured_outputs": {"choice": options}}, lambda t: t in options),
                         ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda t: re.fullmatch("[0-9]{3}", t)),
                         ({"structured_outputs": {"grammar": 'start: "x" "y"+', "disable_any_whitespace": True}},
                          lambda t: re.fullmatch("xy+", t))]:
        speculated = text({**extra, "gamma": 3, "proposer": "model"})
        assert check(speculated), (extra, speculated)
        assert speculated == text({**extra, "gamma": 0}), extra


def test_a_structural_tag_holds_each_triggered_structure_to_its_schema_under_speculation(serve):
    """vLLM's structural tag (in response_format, or as JSON text in structured_outputs): free text, but once the
    trigger "<" comes (the tiny model is biased to it) the structure is held to its begin, JSON of its schema and
    its end, and the text goes on free; the same with speculation (γ = 3) as target-only. Biased alone, the model
    writes "<" over and over."""
    client = serve.client()
    tag = {"type": "structural_tag", "triggers": ["<"],
           "structures": [{"begin": "<tool=f>", "schema": {"type": "object", "properties": {"name": {"enum": ["ada", "bob"]}},
                                                            "required": ["name"], "additionalProperties": False},
                           "end": "</tool>"}]}
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)

    def text(**extra) -> str:
        return client.completions.create(**args, extra_body={"logit_bias": {"60": 100}, **extra}).choices[0].text

    assert text(gamma=0) == "<" * 40
    held = text(response_format=tag, gamma=0)
    assert re.match(r'<tool=f>\{"name": "(ada|bob)"\}</tool><tool=f>\{', held), held
    assert held == text(response_format=tag, gamma=3, proposer="model")
    assert held == text(structured_outputs={"structural_tag": json.dumps(tag)}, gamma=3, proposer="model")


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
              "type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]}}, "required": ["city"],
              "additionalProperties": False}}},
         {"type": "function", "function": {"name": "now"}}]  # no parameters: no arguments


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_tool_call_comes_back_as_tool_calls_under_speculation(serve, stream):
    """A named tool_choice through the official client: one call of that function, its arguments following the
    parameters, no content, finish reason tool_calls; the same with speculation (γ = 3) as target-only, whole and
    streamed (the call arrives whole, no <tool_call> text in the content). "required" without parallel calls:
    one call of either tool."""
    client = serve.client()

    def reply(**kw) -> tuple[str | None, list[tuple[str, str]], str]:
        answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=100,
                                                temperature=0, stream=stream, **kw)
        if not stream:
            choice = answer.choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            return choice.message.content, calls, choice.finish_reason
        content, calls, finish = "", [], None
        for chunk in answer:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                calls += [(c.function.name, c.function.arguments) for c in choice.delta.tool_calls or []]
                finish = choice.finish_reason or finish
        return content, calls, finish

    named = {"type": "function", "function": {"name": "weather"}}
    speculated = reply(tool_choice=named, extra_body={"gamma": 3, "proposer": "model"})
    assert speculated == reply(tool_choice=named, extra_body={"gamma": 0})
    content, calls, finish = speculated
    assert not content and finish == "tool_calls" and [name for name, _ in calls] == ["weather"], speculated
    assert json.loads(calls[0][1])["city"] in ("Rome", "Oslo")
    content, calls, finish = reply(tool_choice="required", parallel_tool_calls=False, extra_body={"gamma": 2})
    assert not content and finish == "tool_calls" and len(calls) == 1 and calls[0][0] in ("weather", "now")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_chat_reply_continues_the_final_message(serve, stream):
    """vLLM's continue_final_message: the prompt is the conversation with the last (assistant) message left
    open, as the template renders it and /tokenize counts it, and the reply is what completions give on those
    ids, the same under speculation (γ = 3) as target-only; with echo the reply starts with that message's
    text."""
    client = serve.client()
    prefill = [*MESSAGES, {"role": "assistant", "content": "def fib(n):\n    "}]
    ids = build_byte_tokenizer().apply_chat_template(prefill, continue_final_message=True, tokenize=True,
                                                     return_dict=False)
    tokenized = httpx.post(serve.base_url.removesuffix("/v1") + "/tokenize", timeout=30, json={
        "model": MODEL, "messages": prefill, "continue_final_message": True, "add_generation_prompt": False}).json()
    assert tokenized["tokens"] == list(ids) and bytes(ids[-6:]) == b":\n    "
    want = client.completions.create(model=MODEL, prompt=list(ids), max_tokens=30, temperature=0).choices[0].text

    def reply(**extra) -> str:
        answer = client.chat.completions.create(model=MODEL, messages=prefill, max_tokens=30, temperature=0,
                                                stream=stream, extra_body={"continue_final_message": True, **extra})
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        assert (answer.usage.prompt_tokens == len(ids)) == extra.get("continue_final_message", True)
        return answer.choices[0].message.content

    assert reply(gamma=0) == want == reply(gamma=3, proposer="model")
    assert reply(echo=True, gamma=3) == "def fib(n):\n    " + want
    assert reply(echo=True, continue_final_message=False, gamma=0) != "def fib(n):\n    " + want


def test_the_chat_templates_arguments(serve):
    """add_generation_prompt: false leaves the assistant's header out; chat_template_kwargs reach the template
    (Qwen3's enable_thinking: false, an empty thought after the header); echo of a user's last message adds
    nothing; the template's own arguments cannot be set through chat_template_kwargs."""
    client = serve.client()
    tokenizer = build_byte_tokenizer()

    def prompt_tokens(**extra) -> int:
        answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1, temperature=0,
                                                extra_body=extra)
        return answer.usage.prompt_tokens

    def rendered(**kw) -> int:
        return len(tokenizer.apply_chat_template(MESSAGES, tokenize=True, return_dict=False, **kw))

    assert prompt_tokens() == rendered(add_generation_prompt=True)
    assert prompt_tokens(add_generation_prompt=False) == rendered(add_generation_prompt=False) < prompt_tokens()
    thinking_off = prompt_tokens(chat_template_kwargs={"enable_thinking": False})
    assert thinking_off == rendered(add_generation_prompt=True, enable_thinking=False) == prompt_tokens() + 19
    assert prompt_tokens(chat_template_kwargs={"unused_variable": 1}) == prompt_tokens()
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    echoed = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                            extra_body={"echo": True})
    assert echoed.choices[0].message.content == plain.choices[0].message.content
    for extra, message in [({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs cannot set tools"),
                           ({"continue_final_message": True, "add_generation_prompt": True}, "cannot be combined"),
                           ({"chat_template_kwargs": [1]}, "chat_template_kwargs")]:
        refused = httpx.post(serve.base_url + "/chat/completions", timeout=30,
                             json={"model": MODEL, "messages": MESSAGES, **extra})
        assert refused.status_code == 400 and message in refused.json()["error"]["message"], refused.text


def test_tools_reach_the_prompt_and_earlier_calls_render_as_the_template_has_them(serve):
    """The tools are in the prompt unless tool_choice is "none"; an earlier assistant call (arguments a JSON
    string, as OpenAI sends them) and the tool's answer render as the chat template renders them with the
    arguments as an object: the prompt is exactly as long."""
    client = serve.client()

    def prompt_tokens(messages: list[dict], **kw) -> int:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0, **kw)
        return answer.usage.prompt_tokens

    tokenizer = build_byte_tokenizer()

    def rendered(messages: list[dict], **kw) -> int:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kw))

    plain = prompt_tokens(MESSAGES)
    assert prompt_tokens(MESSAGES, tools=TOOLS, tool_choice="none") == plain
    assert prompt_tokens(MESSAGES, tools=TOOLS) == rendered(MESSAGES, tools=TOOLS) > plain + 150
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    answered = [{"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
    as_object = {**call, "function": {**call["function"], "arguments": {"city": "Oslo"}}}
    asked = [{"role": "user", "content": "Oslo?"}]
    expected = rendered([*asked, {"role": "assistant", "content": "", "tool_calls": [as_object]}, *answered], tools=TOOLS)
    assert prompt_tokens([*asked, {"role": "assistant", "content": None, "tool_calls": [call]}, *answered],
                         tools=TOOLS) == expected
