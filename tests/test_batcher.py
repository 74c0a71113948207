"""Concurrent sessions share forward passes, and batching changes no bit of any session's logits."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import torch
from conftest import TINY_DRAFT, TINY_TARGET, Worker

from specdec.core.errors import Cancelled, Unavailable
from specdec.core.params import SamplingParams
from specdec.engine.batcher import StepBatcher, expected_gap
from specdec.engine.draft_engine import DraftEngine
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.planning.cost import PROFILE_CONTEXT, CostProfile, positions_past, shared_prompt_chunk


@pytest.fixture
def closing():
    """closing(x) -> x, closed when the test ends: batchers and engines run a thread each."""
    opened = []
    yield lambda thing: opened.append(thing) or thing
    for thing in opened:
        thing.close()


def test_concurrent_steps_share_passes_and_keep_their_bits(closing):
    runner = load_model(TINY_TARGET, device="cpu").runner
    prompts = [[5, 9, 13, 200, 7][: 2 + i] for i in range(4)]

    def decode(step_fn, prompt: list[int], out: list) -> None:
        cache = runner.new_cache()
        logits = step_fn(Step(cache, prompt, logits=len(prompt)))
        out.append(logits)
        for _ in range(6):
            token = int(logits[-1].argmax())
            logits = step_fn(Step(cache, [token]))
            out.append(logits)

    alone = [[] for _ in prompts]
    for prompt, out in zip(prompts, alone, strict=True):
        decode(lambda step: runner.forward([step])[0], prompt, out)

    batcher = closing(StepBatcher(runner, max_wait_s=0.05))
    together = [[] for _ in prompts]
    all_in = threading.Barrier(len(prompts))

    def session(prompt, out):
        with batcher.taking_part():
            all_in.wait(60)  # every session in its round first: a lone one would not wait for the others
            decode(batcher.forward, prompt, out)

    threads = [Worker(session, p, o) for p, o in zip(prompts, together, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for a, b in zip(alone, together, strict=True):
        assert len(a) == len(b) == 7
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), "a batched step's logits differ from its lone run"
    assert batcher.steps == sum(len(o) for o in together) and batcher.forwards < batcher.steps / 2, \
        (batcher.forwards, batcher.steps)


class HoldFirstPass:
    """A runner whose first forward waits (up to 60 s) until it and the steps waiting in `batcher` hold
    `pending` more steps than one: where the first pass already took them (the sessions' steps arrived at once,
    on a slow machine), it waits for nothing. Waiting on the queue alone cost that machine the whole 60 s."""

    def __init__(self, runner, batcher: StepBatcher, pending: int):
        self.runner, self.batcher, self.pending, self.held = runner, batcher, pending, False

    def forward(self, steps):
        if not self.held:
            self.held = True
            deadline = time.monotonic() + 60
            while len(steps) + len(self.batcher._pending) < 1 + self.pending and time.monotonic() < deadline:
                time.sleep(0.001)
        return self.runner.forward(steps)


class SlowFirstPass(HoldFirstPass):
    """`HoldFirstPass`, then `seconds` more before the first pass computes."""

    def __init__(self, runner, batcher: StepBatcher, pending: int, seconds: float):
        super().__init__(runner, batcher, pending)
        self.seconds = seconds

    def forward(self, steps):
        first = not self.held
        out = super().forward(steps)
        if first:
            time.sleep(self.seconds)
        return out


def test_a_step_reports_its_pass_time_and_its_wait_for_the_pass(closing):
    runner = load_model(TINY_TARGET, device="cpu").runner
    batcher = closing(StepBatcher(runner))
    batcher.runner = SlowFirstPass(runner, batcher, pending=1, seconds=0.2)
    shapes = {}

    def submit(name: str, delay_s: float) -> None:
        time.sleep(delay_s)
        shapes[name] = batcher.forward_shaped(Step(runner.new_cache(), [5, 9, 13]))[1]

    # A runs alone and holds its pass until B is pending, then computes for 0.2 s more: B waits that long.
    threads = [Worker(submit, "a", 0.0), Worker(submit, "b", 0.05)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    a, b = shapes["a"], shapes["b"]
    assert (a.rows, a.tokens, b.rows, b.tokens) == (1, 3, 1, 3)
    assert a.seconds >= 0.2 > a.waited_s, a
    assert b.waited_s >= 0.2 > b.seconds, b


class ThreadRecorder:
    """A runner that notes the name of the thread each pass runs on (each pass at least `pass_s`)."""

    def __init__(self, runner, pass_s: float = 0.0):
        self.runner, self.threads, self.pass_s = runner, [], pass_s

    def forward(self, steps):
        self.threads.append(threading.current_thread().name)
        time.sleep(self.pass_s)
        return self.runner.forward(steps)


def test_a_session_forgotten_inside_its_round_is_not_expected_back(closing):
    """A stream cancelled mid-round: its session is forgotten while the round still runs. When the round ends
    it is not expected back, so no pass waits for it: inline (CUDA's default), another session's lone step
    runs on its own thread at once, as with no session away (passes of 0.1 s here, rounds 0.05 s apart: a
    session expected back would be waited for)."""
    runner = load_model(TINY_TARGET, device="cpu").runner
    batcher = closing(StepBatcher(runner, inline=True))
    batcher.runner = recorder = ThreadRecorder(runner, pass_s=0.1)
    cache = runner.new_cache()
    for _ in range(2):  # away 0.05 s between its rounds: expected back that soon after each
        with batcher.taking_part("gone"):
            batcher.forward(Step(cache, [5]))
        time.sleep(0.05)
    with batcher.taking_part("gone"):
        batcher.forward(Step(cache, [7]))
        batcher.forget("gone")
    recorder.threads.clear()
    with batcher.taking_part("other"):
        batcher.forward(Step(runner.new_cache(), [9]))
    assert recorder.threads == [threading.current_thread().name]


@pytest.mark.parametrize("inline", [None, True], ids=["cpu-default", "inline"])
def test_lone_steps_run_inline_only_where_asked_and_shared_ones_on_the_worker(closing, inline):
    """Inline (the default on CUDA) a lone session's passes run on its own thread; on CPU by default, and
    for sessions sharing passes, on the worker. The bits are the same either way."""
    runner = load_model(TINY_TARGET, device="cpu").runner
    batcher = closing(StepBatcher(runner, max_wait_s=0.05, inline=inline))
    batcher.runner = recorder = ThreadRecorder(runner)
    cache = runner.new_cache()
    with batcher.taking_part("lone"):
        lone = [batcher.forward(Step(cache, [5, 9, 13])), batcher.forward(Step(cache, [7]))]
    expected = threading.current_thread().name if inline else "step-batcher"
    assert recorder.threads == [expected] * 2
    assert batcher.forwards == batcher.steps == 2
    batcher.forget("lone")

    recorder.threads.clear()
    all_in = threading.Barrier(2)

    def session(out: list) -> None:
        own = runner.new_cache()
        with batcher.taking_part():
            all_in.wait(60)
            out.append(batcher.forward(Step(own, [5, 9, 13])))
            out.append(batcher.forward(Step(own, [7])))

    shared = [[], []]
    threads = [Worker(session, out) for out in shared]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(recorder.threads) == {"step-batcher"}, recorder.threads
    assert all(torch.equal(a, b) for out in shared for a, b in zip(lone, out, strict=True))


class QueuedPasses:
    """A runner whose passes return as soon as they are queued, as a CUDA pass does: the host's clock reads ~0."""

    device = torch.device("cpu")

    def forward(self, steps):
        return [torch.zeros(step.logits, 4) for step in steps]


class DeviceBusy:
    """`DeviceTimes` as events would read it: every pass kept the device busy `seconds`."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def started(self):
        return object()

    def stopped(self, mark) -> None:
        pass

    def latest_s(self) -> float:
        return self.seconds


def test_sessions_a_round_trip_away_are_waited_for_as_long_as_the_device_pass(closing):
    """Where a pass returns once queued, the return wait is capped by the device's time for a pass, not the
    host's: three sessions that start apart and spend 20 ms away between rounds fall into lockstep. Capped by
    the launch, none was ever waited for, and each ran its own passes (the H200's 3.8 sessions a pass of 8)."""
    batcher = closing(StepBatcher(QueuedPasses(), pass_times=DeviceBusy(0.2)))
    rows: dict[str, list[int]] = {}

    def session(key: str, start_s: float) -> None:
        time.sleep(start_s)
        rows[key] = []
        for _ in range(8):
            with batcher.taking_part(key):
                rows[key].append(batcher.forward_shaped(Step(None, [1]))[1].rows)
            time.sleep(0.02)  # the round trip through the orchestrator
        time.sleep(0.1)  # still expected back while the others finish their rounds
        batcher.forget(key)

    threads = [Worker(session, f"s{i}", 0.007 * i) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    later = [n for key in sorted(rows) for n in rows[key][3:]]  # once every session's gap is known
    assert statistics.median(later) == 3, rows


def test_sessions_back_in_a_changing_order_are_waited_for_by_their_longest_recent_gap(closing):
    """Sessions that leave a pass together come back one after another, in an order that changes every round:
    here four sessions, each away 80, 60, 40 and 20 ms in turn. Once the others are back, a session waited for up
    to twice its last gap alone missed the pass whenever it came back more than twice as late as the round before
    (20 then 80 ms); waited for by its longest recent gap, each is in every pass once its gaps are known."""
    batcher = closing(StepBatcher(QueuedPasses(), pass_times=DeviceBusy(0.2)))
    rows: dict[int, list[int]] = {}

    def session(index: int) -> None:
        rows[index] = []
        for turn in range(12):
            with batcher.taking_part(index):
                rows[index].append(batcher.forward_shaped(Step(None, [1]))[1].rows)
            time.sleep(0.02 * (1 + (index - turn) % 4))  # back last, third, second, first, last again, ...
        time.sleep(0.2)  # still expected back while the others finish their rounds
        batcher.forget(index)

    threads = [Worker(session, i) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    later = [n for key in sorted(rows) for n in rows[key][5:]]  # once each session's longest gap is known
    assert statistics.mean(later) > 3.5, rows


def test_a_gap_past_the_return_wait_is_not_remembered_past_the_next_round():
    """A session away longer than the return wait's cap (drafting elsewhere: 2 s against passes of 0.34 s) is not
    waited for, and once back to round trips of 10 ms it is expected back as before it left, not after 0.9 × 2 s
    (which would again be past the cap, for 18 rounds). Round trips within the cap are remembered."""
    cap = 0.34
    expected = expected_gap(0.010, None, cap)
    expected = expected_gap(0.040, expected, cap)
    assert expected == pytest.approx(0.040)
    expected = expected_gap(0.010, expected, cap)
    assert expected == pytest.approx(0.036)  # the longest recent gap, weighed down once
    expected = expected_gap(2.0, expected, cap)
    assert expected == 2.0  # away on other work: not waited for
    assert expected_gap(0.010, expected, cap) == pytest.approx(0.010)


def test_a_recent_gap_as_long_as_half_a_pass_is_not_remembered():
    """Where sessions' round trips are as long as a pass (an H200: passes of 2.3 ms, round trips of 1-3 ms), a
    wait for the slowest recent gap costs the sessions at hand about the pass it saves: the last gap alone decides.
    Where they are short against it (a Zen 1: 5-20 ms against 340 ms), the longest recent gap is remembered."""
    gpu_cap = 0.0023
    assert expected_gap(0.0012, 0.0020, gpu_cap) == 0.0012  # 2 × 0.9 × 2.0 ms past the cap
    assert expected_gap(0.0012, 0.0012, gpu_cap) == pytest.approx(0.0012)  # within it: remembered, no longer
    assert expected_gap(0.0005, 0.0012, gpu_cap) == pytest.approx(0.9 * 0.0012)
    assert expected_gap(0.006, 0.020, 0.34) == pytest.approx(0.018)


def test_concurrent_engine_rounds_match_sequential_rounds(closing):
    """Greedy draft and verify rounds of 4 sessions at once give what each gives alone."""
    draft = closing(DraftEngine(load_model(TINY_DRAFT, device="cpu")))
    target = closing(TargetEngine(load_model(TINY_TARGET, device="cpu")))
    prompts = {f"s{i}": [3 + i, 40, 41 + i, 90] for i in range(4)}

    def run(suffix: str, session_id: str, prompt: list[int], out: dict) -> None:
        sid = session_id + suffix
        draft.open(sid, SamplingParams())
        target.open(sid, SamplingParams())
        committed = list(prompt)
        for _ in range(5):
            proposal = draft.propose(sid, 0, committed, gamma=3)
            verdict = target.verify(sid, 0, committed, proposal.tokens, None).verdict
            committed += list(verdict.tokens)
        out[session_id] = committed
        draft.release(sid)
        target.release(sid)

    alone: dict = {}
    for sid, prompt in prompts.items():
        run("-alone", sid, prompt, alone)
    # The first shared target pass waits until two more sessions' steps are pending, so that passes are
    # shared however the threads are scheduled (a busy machine can otherwise run them one after another).
    target.batcher.runner = HoldFirstPass(target.runner, target.batcher, pending=2)
    together: dict = {}
    threads = [Worker(run, "-together", sid, p, together) for sid, p in prompts.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone
    assert target.batcher.forwards < target.batcher.steps


def test_a_step_that_fails_fails_alone(closing):
    """A pass that raises is rerun step by step: the other steps get their own logits, bit for bit."""
    runner = load_model(TINY_TARGET, device="cpu").runner
    prompts = [[5, 9, 13], [7, 8], [200, 3, 4, 5]]
    alone = [runner.forward([Step(runner.new_cache(), p, logits=len(p))])[0] for p in prompts]

    class Broken:
        length = 0

        def reserve(self, length: int) -> None:
            raise MemoryError("no room for this session's cache")

    steps = [Step(runner.new_cache(), p, logits=len(p)) for p in prompts] + [Step(Broken(), [1, 2])]
    batcher = closing(StepBatcher(runner, max_wait_s=0.2))
    results, errors = {}, {}

    def session(i: int) -> None:
        with batcher.taking_part():
            try:
                results[i] = batcher.forward(steps[i])
            except MemoryError as error:
                errors[i] = error

    threads = [Worker(session, i) for i in range(len(steps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert list(errors) == [3], errors
    assert all(torch.equal(results[i], alone[i]) for i in range(3))
    assert [s.cache.length for s in steps[:3]] == [len(p) for p in prompts], "each good cache advanced once"


LINEAR = CostProfile(tuple(0.020 + 0.003 * n for n in (*range(1, 10), 18, 36, 72)), (*range(1, 10), 18, 36, 72))


def test_a_prompt_chunk_is_the_most_that_keeps_the_others_within_the_slowdown():
    """Priced by a profile of 20 ms + 3 ms a token: beside one session (23 ms alone) a 3× budget of 69 ms
    takes 16 rows, its own and 15 of the prompt's; beside eight (44 ms) 132 ms, 37 rows: 29 of the prompt's.
    Past the profile's sizes it extrapolates; at least one token; a flat curve (a GPU's) takes the longest."""
    assert shared_prompt_chunk(LINEAR, 1, 256, 3.0) == 15
    assert shared_prompt_chunk(LINEAR, 8, 256, 3.0) == 29
    assert shared_prompt_chunk(LINEAR, 1, 256, 12.0) == 84, "(12 × 23 ms − 20 ms) / 3 ms = 85.3 rows, past 72"
    assert shared_prompt_chunk(LINEAR, 1, 12, 12.0) == 12
    assert shared_prompt_chunk(LINEAR, 1, 256, 1.0) == 1
    assert shared_prompt_chunk(CostProfile((0.003,) * 9), 4, 256, 3.0) == 256


def test_at_depth_a_prompt_chunk_prices_the_attention_of_both():
    """At 1 µs per token and position past PROFILE_CONTEXT (LINEAR otherwise): beside one session 2,000 positions
    deep (23 + 2 ms alone, so 75 ms at 3×), a prompt from an empty cache takes 16 tokens (25 + 3 ms each), one
    1,000 positions in 12 (4 ms each); without the depth term both are 15. No measured term: as before."""
    deep = CostProfile(LINEAR.seconds, LINEAR.tokens, per_position_s=1e-6)
    assert positions_past(5, 100) == 0 and positions_past(5, PROFILE_CONTEXT + 100) == 500
    assert shared_prompt_chunk(deep, 1, 256, 3.0, others_past=2000) == 16
    assert shared_prompt_chunk(deep, 1, 256, 3.0, others_past=2000, prompt_cached=PROFILE_CONTEXT + 1000) == 12
    assert shared_prompt_chunk(deep, 1, 256, 3.0) == shared_prompt_chunk(LINEAR, 1, 256, 3.0) == 15
    assert shared_prompt_chunk(LINEAR, 1, 256, 3.0, 2000, PROFILE_CONTEXT + 1000) == 15, "unmeasured: no term"


def test_deeper_into_its_prompt_a_chunk_beside_a_session_grows_smaller(closing, monkeypatch):
    """Through the engine: a 400-token prompt beside a neighbour 300 tokens deep, priced at 50 µs per token and
    position, goes in chunks that shrink as its own cache passes PROFILE_CONTEXT, each the rule's for the caches
    as they stand; the verdict is the prompt's alone."""
    from specdec.engine.model_engine import SHARED_SLOWDOWN

    target = closing(TargetEngine(load_model(TINY_TARGET, device="cpu"), prefix_cache_bytes=0))
    prompt = [(7 * i) % 250 + 3 for i in range(400)]
    target.open("alone", SamplingParams())
    alone = target.verify("alone", 0, prompt, [5, 6], None).verdict.tokens
    target.release("alone")
    target.use_profile(CostProfile(LINEAR.seconds, LINEAR.tokens, per_position_s=5e-5))
    target.open("neighbour", SamplingParams())
    target.verify("neighbour", 0, [(11 * i + 5) % 250 + 3 for i in range(300)], [], None)  # no prefix to share
    target.open("long", SamplingParams())
    fed = _feeding(target, monkeypatch, lambda count: None)
    assert target.verify("long", 0, prompt, [5, 6], None).verdict.tokens == alone
    expected, cached, total, logits = [], 0, len(prompt) + 2, 3  # the last chunk holds the 3 positions scored
    while cached < total:
        chunk = shared_prompt_chunk(target.cost_profile, 1, 256, SHARED_SLOWDOWN, 300 - PROFILE_CONTEXT, cached)
        expected.append(total - cached if total - cached <= chunk else min(chunk, total - cached - logits))
        cached += expected[-1]
    assert fed == expected and fed[0] > fed[-2], fed


def test_a_long_prompt_beside_other_sessions_goes_in_small_chunks(closing):
    """Alone, a 100-token prompt is one forward; beside other live sessions, it is fed in chunks that leave
    room for their decode steps: as the cost profile prices them (SHARED_SLOWDOWN), larger beside more
    sessions, or SHARED_PREFILL_CHUNK with no profile. The verdict is the same every way."""
    from specdec.engine.model_engine import SHARED_PREFILL_CHUNK, SHARED_SLOWDOWN

    target = closing(TargetEngine(load_model(TINY_TARGET, device="cpu"), prefix_cache_bytes=0))  # each prefill computed
    prompt = [(7 * i) % 250 + 3 for i in range(100)]

    def prefill(session_id: str):
        target.open(session_id, SamplingParams())
        before = target.batcher.forwards
        verdict = target.verify(session_id, 0, prompt, [5, 6], None).verdict
        target.release(session_id)
        return verdict.tokens, target.batcher.forwards - before

    alone, alone_passes = prefill("alone")
    assert alone_passes == 1
    target.open("neighbour", SamplingParams())
    assert prefill("beside") == (alone, -(-len(prompt) // SHARED_PREFILL_CHUNK))
    target.use_profile(LINEAR)
    one = shared_prompt_chunk(LINEAR, 1, 256, SHARED_SLOWDOWN)
    assert prefill("beside") == (alone, -(-len(prompt) // one))
    for i in range(7):
        target.open(f"more {i}", SamplingParams())
    eight = shared_prompt_chunk(LINEAR, 8, 256, SHARED_SLOWDOWN)
    assert one < eight < len(prompt)
    assert prefill("beside") == (alone, -(-len(prompt) // eight))
    with pytest.raises(ValueError, match="prompt_slowdown must be at least 1"):
        TargetEngine(target.loaded, prompt_slowdown=0.5)


def _feeding(target: TargetEngine, monkeypatch, after_step) -> list[int]:
    """The tokens of each step the engine's rounds feed, in order; after_step(count) runs after each."""
    fed, step = [], target._step

    def recorded(session, one):
        fed.append(len(one.tokens))
        out = step(session, one)
        after_step(len(fed))
        return out

    monkeypatch.setattr(target, "_step", recorded)
    return fed


def test_a_session_arriving_mid_prompt_gets_its_share_from_the_next_chunk(closing, monkeypatch):
    """A prompt that started alone goes in chunks of PREFILL_CHUNK until another session opens; from its next
    chunk on, in the chunks that leave that session room. The verdict is the prompt's alone."""
    from specdec.engine.model_engine import PREFILL_CHUNK, SHARED_SLOWDOWN

    target = closing(TargetEngine(load_model(TINY_TARGET, device="cpu"), prefix_cache_bytes=0))
    target.use_profile(LINEAR)
    prompt = [(7 * i) % 250 + 3 for i in range(400)]
    target.open("alone", SamplingParams())
    alone = target.verify("alone", 0, prompt, [5, 6], None).verdict.tokens
    target.release("alone")
    target.open("long", SamplingParams())
    fed = _feeding(target, monkeypatch, lambda count: count == 1 and target.open("newcomer", SamplingParams()))
    assert target.verify("long", 0, prompt, [5, 6], None).verdict.tokens == alone
    beside = shared_prompt_chunk(LINEAR, 1, PREFILL_CHUNK, SHARED_SLOWDOWN)
    assert fed[0] == PREFILL_CHUNK and sum(fed) == len(prompt) + 2
    assert fed[1:] == [beside] * (len(fed) - 2) + [fed[-1]] and 3 <= fed[-1] <= beside, fed


def test_a_session_released_mid_prompt_stops_before_its_next_chunk(closing, monkeypatch):
    """A stream cancelled while its prompt goes in releases the session: the round raises Cancelled before
    its next chunk, and the passes it no longer needs are not run. The engine serves on."""
    target = closing(TargetEngine(load_model(TINY_TARGET, device="cpu"), prefix_cache_bytes=0))
    target.use_profile(LINEAR)
    prompt = [(7 * i) % 250 + 3 for i in range(400)]
    target.open("neighbour", SamplingParams())  # chunks of 15: 27 passes
    target.open("long", SamplingParams())
    fed = _feeding(target, monkeypatch, lambda count: count == 2 and target.release("long"))
    with pytest.raises(Cancelled, match="ended with 372 of its 402 tokens not yet fed"):
        target.verify("long", 0, prompt, [5, 6], None)
    assert len(fed) == 2 and target.live_sessions == 1
    monkeypatch.undo()
    target.open("long", SamplingParams())
    assert len(target.verify("long", 0, prompt, [5, 6], None).verdict.tokens) >= 1


def test_a_closed_engine_stops_its_thread_and_refuses_steps():
    with TargetEngine(load_model(TINY_TARGET, device="cpu")) as target:
        target.open("s", SamplingParams())
        target.verify("s", 0, [5, 6, 7], [8], None)
        assert target.batcher.running
    assert not target.batcher.running
    with pytest.raises(Unavailable):
        target.verify("s", 0, [5, 6, 7, 8], [9], None)
    target.close()  # idempotent
