"""Tensor-parallel target: sharded logits, one endpoint over N ranks, consistent KV, loud failures."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import grpc
import pytest
import torch
from conftest import TINY_TARGET, Worker, assert_speculated, tiny_options
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.errors import ResourceExhausted, Unavailable
from specdec.engine import memory_budget
from specdec.engine.kvcache import HEADROOM_BYTES
from specdec.engine.model_engine import PREFILL_CHUNK, SHARED_PREFILL_CHUNK, SHARED_SLOWDOWN
from specdec.engine.models import build_tiny_model
from specdec.engine.profile_cache import weights_fingerprint
from specdec.engine.runner import ModelRunner, Step
from specdec.engine.tp import check_shardable, shard_model
from specdec.launch.stack import EmbeddedStack
from specdec.planning.cost import CostProfile, shared_prompt_chunk
from specdec.runtime.server import free_port
from target_service.tensor_parallel import StartupError, TensorParallelTarget, rendezvous

PROMPTS = ["def fib(n):", "The quick brown fox", "tensor parallel"]
STEPS = [[5, 17, 101, 3, 250, 42], [7], [9, 11, 13]]  # prefill, decode, a verify-sized chunk


def _forward_steps(runner: ModelRunner) -> list[torch.Tensor]:
    cache = runner.new_cache()
    return [runner.forward([Step(cache, ids, logits=len(ids))])[0] for ids in STEPS]


def _runner(collectives=None, rank: int = 0, world: int = 1) -> ModelRunner:
    model = build_tiny_model(TINY_TARGET).eval()
    if world > 1:
        collectives = shard_model(model, rank, world)
    return ModelRunner(model, "fp32", fp32_kernel="dense", collectives=collectives)


def _kernel_bytes(runner: ModelRunner) -> int:
    """Bytes of the sharded weights: every projection and the LM head."""
    return sum(k.weight_bytes() for k in runner.linear_kernels())


def _rank_forward(rank: int, world: int, port: int, results) -> None:
    rendezvous(rank, world, f"127.0.0.1:{port}", torch.device("cpu"), timeout_s=60)
    torch.set_num_threads(1)
    runner = _runner(rank=rank, world=world)
    logits = _forward_steps(runner)
    _leave(results, (rank, [t.numpy().copy() for t in logits], runner.weight_bytes()))  # plain pickles


def _leave(results, result: tuple) -> None:
    """A rank's end: `result` (rank first) sent, the group torn down once no rank may still use it."""
    results.put(result)
    torch.distributed.barrier()  # neither rank tears its pairs down while the other may still use them
    torch.distributed.destroy_process_group()
    results.close()
    results.join_thread()  # the result is through the pipe before the process goes
    # Leave without the interpreter's teardown (as an orphaned service does, `specdec.runtime.server`): in one
    # clean-clone CI run (2026-11-30, the first in dozens) both ranks aborted after their logits were sent, in
    # `destroy_process_group` or the teardown ("terminate called without an active exception": exit -6).
    os._exit(0)


def _run_ranks(rank_main, world: int = 2) -> dict[int, tuple]:
    """`rank_main(rank, world, port, results)` in a process per rank; their results (after the rank) by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, results)) for r in range(world)]
    for proc in procs:
        proc.start()
    got = {rank: rest for rank, *rest in (results.get(timeout=120) for _ in procs)}
    for proc in procs:
        proc.join(30)
    assert [proc.exitcode for proc in procs] == [0] * world
    return got


def test_sharded_logits_match_unsharded_through_the_kv_cache():
    whole = _runner()
    expected = _forward_steps(whole)
    got = _run_ranks(_rank_forward)
    for rank in (0, 1):
        for step, (want, have) in enumerate(zip(expected, got[rank][0], strict=True)):
            torch.testing.assert_close(torch.from_numpy(have), want, rtol=1e-4, atol=1e-5, msg=f"rank {rank}, step {step}")
    # Each rank keeps half of every attention and MLP projection and of the LM head; embeddings and
    # norms stay whole.
    assert got[0][1] == got[1][1] == whole.weight_bytes() - _kernel_bytes(whole) // 2


def _rank_growths(rank: int, world: int, port: int, results) -> None:
    """Rank `rank` grows a fresh cache to 100 positions under three memories (phase: what its machine has, as a
    function of one shard's storage s), after each the outcome; then a step through the grown cache."""
    rendezvous(rank, world, f"127.0.0.1:{port}", torch.device("cpu"), timeout_s=60)
    torch.set_num_threads(1)
    runner = _runner(rank=rank, world=world)
    probe = runner.new_cache()
    probe.shards = None
    probe.reserve(100)
    shard = probe.nbytes()
    phases = {  # both shards are on this machine: a growth needs 2 s and the headroom
        "rank 1 short": lambda: 10**15 if rank == 0 else 2 * shard + HEADROOM_BYTES - 1,
        "room for one shard": lambda: shard + HEADROOM_BYTES,
        "room for both": lambda: 2 * shard + HEADROOM_BYTES,
    }
    cache, outcomes = runner.new_cache(), []
    for phase, available in phases.items():
        memory_budget.available_bytes = available
        try:
            cache.reserve(100)
            outcomes.append((phase, "grew", cache.capacity))
        except ResourceExhausted as refusal:
            outcomes.append((phase, str(refusal), cache.capacity))
    logits = runner.forward([Step(cache, STEPS[0], logits=1)])[0]
    _leave(results, (rank, outcomes, logits.numpy().copy()))


def test_tensor_parallel_ranks_refuse_a_kv_growth_together_counting_the_shards_of_one_machine():
    """A shard's cache grows into memory its machine has for every shard it holds, and its ranks decide together:
    one rank refusing a growth its peers made would leave them waiting in the pass's collectives (before, a shard's
    cache grew unchecked). Here one rank lacking the memory refuses it on both; so does room for one shard of
    the two this machine holds; with room for both, both grow and the pass runs."""
    got = _run_ranks(_rank_growths)
    (zero, logits0), (one, logits1) = got[0], got[1]
    assert [o[0] for o in zero] == ["rank 1 short", "room for one shard", "room for both"]
    assert zero[0][1].startswith("a KV cache of") and "another tensor-parallel rank" in zero[0][1], zero[0]
    for refusal in (one[0][1], zero[1][1], one[1][1]):
        assert "a KV cache of" in refusal and "(2 shards on this machine) needs about" in refusal, refusal
    assert [o[2] for o in zero] == [o[2] for o in one] == [0, 0, zero[2][2]] and zero[2][2] >= 100
    assert zero[2][1] == one[2][1] == "grew"
    assert (logits0 == logits1).all(), "the ranks' logits after the growth"


def _stuck_command_and_an_exiting_rank(results) -> None:
    """In a process of its own, rank 0 of a world of one: its engine's `open` never returns, as a collective
    that does not notice its peer is gone; then the (pretend) follower rank exits."""
    rendezvous(0, 1, f"127.0.0.1:{free_port()}", torch.device("cpu"), timeout_s=60)
    entered, never = threading.Event(), threading.Event()

    class StuckEngine:
        def open(self, session_id, params):
            entered.set()
            never.wait()

    follower = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    front = TensorParallelTarget(StuckEngine(), torch.distributed.group.WORLD, 2, [follower])
    told: list[str] = []
    front.on_failure.append(told.append)

    def call(session_id: str) -> tuple[str, float]:
        try:
            front.open(session_id, None)
            return "returned", time.monotonic()
        except Unavailable as exc:
            return str(exc), time.monotonic()

    stuck: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: stuck.put(call("stuck")), daemon=True).start()
    assert entered.wait(60)
    follower.kill()
    killed = time.monotonic()
    message, failed_at = stuck.get(timeout=60)
    after, after_at = call("after")
    results.put((message, failed_at - killed, after, after_at - failed_at, told))
    results.close()
    results.join_thread()
    os._exit(0)  # the driver thread is still inside the stuck command


def test_a_rank_seen_exiting_fails_the_command_in_flight_even_where_its_collective_waits_on():
    """Rank 0's callers wait for their command or the front's failure: a follower's exit fails the call in
    flight at once (a collective can wait out its timeout on a peer's death: CI once saw a stream end after
    30 s, the orchestrator's deadline), and every call after it."""
    results = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_stuck_command_and_an_exiting_rank, args=(results,))
    proc.start()
    try:
        message, failed_after_s, after, after_s, told = results.get(timeout=120)
    finally:
        proc.join(30)
        proc.kill()
    assert "rank 1 exited with code -9" in message and failed_after_s < 5, (message, failed_after_s)
    assert after == message and after_s < 1
    assert told == [message]


def test_unshardable_config_is_refused():
    model = build_tiny_model("tiny:heads=4,kv_heads=2")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        check_shardable(model.config, 4)


def test_rendezvous_fails_clearly_when_workers_do_not_arrive():
    began = time.monotonic()
    with pytest.raises(StartupError, match="could not rendezvous"):
        rendezvous(0, 2, f"127.0.0.1:{free_port()}", torch.device("cpu"), timeout_s=2)
    assert time.monotonic() - began < 30


def _tp_stack(**overrides) -> EmbeddedStack:
    opts = tiny_options(target_tp=2, **overrides)
    return EmbeddedStack(opts)


def _target_info(stack: EmbeddedStack) -> pb.ModelInfo:
    with grpc.insecure_channel(stack.target_address) as channel:
        return pb_grpc.TargetServiceStub(channel).Info(pb.ModelInfoRequest(), timeout=10)


@pytest.fixture(scope="module")
def tp_stack():
    with _tp_stack() as running:
        yield running


@pytest.mark.parametrize("gamma", [0, 3, None])
def test_tp2_greedy_matches_tp1_and_target_only(stack, tp_stack, gamma):
    for prompt in PROMPTS:
        reference = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=0)).token_ids
        tp2 = generate(tp_stack.endpoint, make_request(prompt=prompt, max_new_tokens=48, gamma=gamma))
        assert tp2.token_ids == reference, f"γ={gamma}, prompt {prompt!r}"
        if gamma:
            assert_speculated(tp2, f"at γ={gamma} on {prompt!r}")


def test_tp2_logprobs_do_not_change_under_speculation(tp_stack):
    """Rank 0 computes them from the gathered logits: the same under γ = 0 and γ = 3."""
    runs = [generate(tp_stack.endpoint, make_request(prompt=PROMPTS[0], max_new_tokens=24, gamma=gamma,
                                                     top_logprobs=3)) for gamma in (0, 3)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].logprobs) == 24
    assert_speculated(runs[1])
    assert runs[0].logprobs == runs[1].logprobs


def test_tp2_scores_a_prompt_with_its_generations_numbers(tp_stack):
    """A prompt's log-probabilities: every rank runs the passes that compute every position's logits (a
    follower that did not would hang the gather), and rank 0's numbers for generated tokens are theirs."""
    made = generate(tp_stack.endpoint, make_request(prompt=PROMPTS[1], max_new_tokens=12, gamma=3, top_logprobs=2))
    prompt = list(made_prompt_ids(tp_stack, PROMPTS[1]))
    scored = generate(tp_stack.endpoint, make_request(prompt_token_ids=prompt + made.token_ids, max_new_tokens=4,
                                                      gamma=3, prompt_top=2), timeout=60)
    assert scored.prompt_logprobs[len(prompt) - 1:] == made.logprobs
    again = generate(tp_stack.endpoint, make_request(prompt=PROMPTS[1], max_new_tokens=12, gamma=3), timeout=60)
    assert again.token_ids == made.token_ids, "the ranks' caches stayed in step"


def test_tp2_ranks_cut_a_prompt_beside_a_live_session_into_the_same_chunks(stack, tp_stack):
    """Beside a live session a prompt goes in chunks the cost profile sizes (`Engine.prompt_chunk`): every
    rank must cut the same ones, or their collectives disagree. A second stack takes the first one's profile
    from the cache, which rank 0 alone reads: the followers get it from rank 0. A long prompt while a reply
    streams: both as target-only on one rank. The cached profile is set to 20 ms + 3 ms a token, whose chunk
    beside one session (15) is not SHARED_PREFILL_CHUNK, what a follower without it would cut: as measured, the
    two could meet on a busy machine (they did once, with both cores busy)."""
    with _cached_tp_profiles(lambda tokens: 0.020 + 0.003 * tokens) as profiles:
        chunks = {shared_prompt_chunk(profile, 1, PREFILL_CHUNK, SHARED_SLOWDOWN) for profile in profiles}
        assert chunks == {15} and SHARED_PREFILL_CHUNK != 15
        long_prompt = "".join(f"x{i} = {i * i}\n" for i in range(40))  # 300+ tokens: chunked either way
        short = make_request(prompt=PROMPTS[0], max_new_tokens=150, gamma=0)
        short.ignore_eos = True  # streams to its length
        reference = [generate(stack.endpoint, request).token_ids
                     for request in (short, make_request(prompt=long_prompt, max_new_tokens=8, gamma=0))]
        with _tp_stack() as again, grpc.insecure_channel(again.endpoint) as channel:
            stream = pb_grpc.SpecDecStub(channel).Generate(short, timeout=120)
            streamed = list(next(stream).token_ids)  # the short session is live from here
            beside = generate(again.endpoint, make_request(prompt=long_prompt, max_new_tokens=8, gamma=0),
                              timeout=120)
            streamed += [t for message in stream for t in message.token_ids]
    assert beside.token_ids == reference[1] and streamed == reference[0]


@contextlib.contextmanager
def _cached_tp_profiles(seconds: Callable[[int], float]) -> Iterator[list[CostProfile]]:
    """The tiny target's profiles as tensor-parallel stacks of two measured and cached them, each size's time set
    to seconds(size) while the block runs (stacks that start in it take those), restored after."""
    folder = Path(os.environ["SPECDEC_PROFILE_CACHE"])
    files = {f: f.read_text() for f in folder.glob("*.json")}
    ours = {f: json.loads(text) for f, text in files.items()}
    ours = {f: e for f, e in ours.items()
            if e["key"]["world"] == 2 and e["key"]["weights"] == weights_fingerprint(TINY_TARGET)}
    try:
        for file, entry in ours.items():
            file.write_text(json.dumps({**entry, "seconds": [seconds(n) for n in entry["tokens"]]}))
        yield [CostProfile(tuple(seconds(n) for n in e["tokens"]), tuple(e["tokens"])) for e in ours.values()]
    finally:
        for file in ours:
            file.write_text(files[file])


def made_prompt_ids(stack: EmbeddedStack, prompt: str) -> list[int]:
    """The prompt's token ids, as the orchestrator reads them (its prompt logprobs come with them)."""
    return generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=1, gamma=0, prompt_top=0),
                    timeout=60).prompt_token_ids


def test_ranks_hold_half_the_layers_and_identical_kv_caches(tp_stack):
    info = _target_info(tp_stack)
    assert info.tensor_parallel_size == 2 and [r.rank for r in info.ranks] == [0, 1]
    assert info.ranks[0].pid != info.ranks[1].pid
    full = _runner().weight_bytes()
    assert all(r.parameter_bytes < full for r in info.ranks)

    # Poll every rank's KV state while generations with rollbacks (γ=4 vs a perturbed draft) and a
    # cancelled stream run: each snapshot is taken between two commands, so ranks must agree exactly.
    done = threading.Event()
    snapshots: list[list[dict]] = []

    def poll():
        while not done.is_set():
            snapshots.append([(r.live_sessions, r.cached_tokens, r.kept_tokens) for r in _target_info(tp_stack).ranks])

    poller = Worker(poll)
    poller.start()
    try:
        for prompt in PROMPTS:
            generate(tp_stack.endpoint, make_request(prompt=prompt, max_new_tokens=120, gamma=4))
        for _ in range(2):  # the second takes the first's kept cache
            again = generate(tp_stack.endpoint, make_request(prompt=PROMPTS[0] * 4, max_new_tokens=8, gamma=4))
        assert again.stats["cached_prompt_tokens"] > 0, "every rank took the kept cache of the same prompt"
        with grpc.insecure_channel(tp_stack.endpoint) as channel:
            stream = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="cancel me", max_new_tokens=400))
            next(stream)
            stream.cancel()
    finally:
        done.set()
        poller.join(60)
    assert any(s[0][0] for s in snapshots), "no snapshot saw a live session"
    assert any(s[0][2] for s in snapshots), "no snapshot saw a kept cache"
    assert all(s[0] == s[1] for s in snapshots), [s for s in snapshots if s[0] != s[1]][:3]
    deadline = time.monotonic() + 10
    while any(r.live_sessions for r in _target_info(tp_stack).ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(r.live_sessions or r.cached_tokens for r in _target_info(tp_stack).ranks), \
        "a cancelled session still holds a live cache"


def test_killed_worker_rank_fails_the_stream_fast_and_marks_target_not_serving():
    with _tp_stack() as stack:
        follower_pid = _target_info(stack).ranks[1].pid
        with grpc.insecure_channel(stack.endpoint) as channel:
            stream = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="hello", max_new_tokens=400, gamma=2),
                                                               timeout=60)
            next(stream)
            os.kill(follower_pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(grpc.RpcError) as failure:
                for _ in stream:
                    pass
            took = time.monotonic() - killed
            assert took < 10, f"failed after {took:.1f} s: {failure.value.code()}: {failure.value.details()}"
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE, failure.value.details()
        assert "rank 1 exited" in failure.value.details(), failure.value.details()
        with grpc.insecure_channel(stack.target_address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="specdec.v1.TargetService"), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as again:
            generate(stack.endpoint, make_request(prompt="after", max_new_tokens=8, gamma=0), timeout=30)
        assert again.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - began < 10
