"""A tensor-parallel target behind one endpoint: rank 0 serves gRPC, ranks > 0 follow.

Every rank holds a `TargetEngine` over its shard of the model (`specdec.engine.tp`). Rank 0
broadcasts each state-changing engine call (open, verify, release) on a gloo group before
running it; the followers run the same call, so every rank executes the same forward passes
in the same order and their KV caches stay identical through rollbacks and releases. Only
rank 0 samples: followers run `TargetEngine.score`, the forward pass without the sampler.

Failure is loud: a follower that exits, or a collective that errors, marks the front failed;
the health service turns NOT_SERVING and every call raises Unavailable. The commands run on one
driver thread, in order, and a caller waits for its command's result or the front's failure,
whichever comes first: a rank seen exiting fails the calls in flight at once, even where a
collective waiting on it does not notice (a collective cannot be interrupted; it is left to its
timeout on the driver thread).
"""

from __future__ import annotations

import datetime
import logging
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from specdec.core.errors import SpecDecError, Unavailable
from specdec.engine.backend import Verification
from specdec.engine.target_engine import TargetEngine
from specdec.engine.profile_cache import ProfileCache, load_or_measure

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0  # an idle rank 0 pings the followers this often, well inside the collective timeout


class StartupError(RuntimeError):
    """The ranks could not rendezvous, or a follower failed while loading."""


def rendezvous(rank: int, world: int, master: str, device: torch.device, timeout_s: float):
    """Join the process group; returns the gloo group used for commands.

    The collective backend is nccl on CUDA and gloo on CPU. Raises StartupError when the ranks
    do not all arrive within `timeout_s`.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, init_method=f"tcp://{master}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - torch raises several store/timeout types
        raise StartupError(f"tensor-parallel rank {rank}/{world} could not rendezvous at {master} "
                           f"within {timeout_s:.0f}s: {exc}") from exc
    return dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")


def wait_for_ranks(group, timeout_s: float) -> None:
    """Barrier after loading: a follower that failed to load is named in the error."""
    try:
        dist.monitored_barrier(group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except Exception as exc:  # noqa: BLE001
        raise StartupError(f"tensor-parallel ranks did not all finish loading: {exc}") from exc


class TensorParallelTarget:
    """Rank 0's front: the interface the servicer uses on a TargetEngine, replicated to every rank."""

    def __init__(self, engine: TargetEngine, group, world: int, followers: list[subprocess.Popen] = ()):
        self.engine, self.group, self.tensor_parallel_size = engine, group, world
        self.failure: str | None = None
        self._failing = False  # fail() has begun
        self.on_failure: list[Callable[[str], None]] = []
        self._settled = threading.Condition()  # a command finished, or the front failed
        self._commands: queue.SimpleQueue[_Command | None] = queue.SimpleQueue()
        self._last_command = time.monotonic()
        self._closed = threading.Event()
        self._followers = list(enumerate(followers, start=1))
        threading.Thread(target=self._drive, daemon=True, name="tp-driver").start()
        for rank, proc in self._followers:
            threading.Thread(target=self._watch, args=(rank, proc), daemon=True, name=f"tp-watch-{rank}").start()
        threading.Thread(target=self._heartbeat, daemon=True, name="tp-heartbeat").start()

    # -- the engine interface ---------------------------------------------
    @property
    def loaded(self):
        return self.engine.loaded

    @property
    def gamma_max(self) -> int:
        return self.engine.gamma_max

    @property
    def max_sessions(self) -> int:
        return self.engine.max_sessions

    @property
    def live_sessions(self) -> int:
        return self.engine.live_sessions

    @property
    def batcher(self):
        return self.engine.batcher

    @property
    def cost_profile(self):
        return self.engine.cost_profile

    def measure_costs(self, max_tokens: int, cache: ProfileCache | None = None, progress=None):
        """Every rank times the same forwards: they are collective. Rank 0's result (or a cached profile,
        which spares every rank the measurement) then goes to every rank: the profile sizes a prompt's
        chunks (`Engine.prompt_chunk`), and the ranks must cut the same chunks. `progress`: rank 0's."""
        profile = load_or_measure(
            cache, lambda: self.engine.profile_key(max_tokens, self.tensor_parallel_size),
            lambda: self._replicate(("measure", max_tokens),
                                    lambda: self.engine.measure_costs(max_tokens, progress=progress)))
        self._replicate(("profile", profile), lambda: self.engine.use_profile(profile))
        return profile

    def open(self, session_id: str, params) -> None:
        self._replicate(("open", session_id, params), lambda: self.engine.open(session_id, params))

    def release(self, session_id: str) -> bool:
        if self.failure:  # nothing to keep consistent any more; free rank 0's cache
            return self.engine.release(session_id)
        return self._replicate(("release", session_id), lambda: self.engine.release(session_id))

    def verify(self, session_id: str, start: int, tokens: list[int], draft_tokens: list[int],
               draft_probs: torch.Tensor | None, top_logprobs: int | None = None,
               prompt_top: int | None = None) -> Verification:
        """Followers score (every position's logits too when the prompt's log-probabilities are asked for);
        rank 0 also samples and, when asked, computes the log-probabilities."""
        # q stays on rank 0: check it first
        self.engine.check_request(draft_tokens, draft_probs, top_logprobs, prompt_top)
        return self._replicate(("score", session_id, start, tokens, draft_tokens, prompt_top is not None),
                               lambda: self.engine.verify(session_id, start, tokens, draft_tokens, draft_probs,
                                                          top_logprobs, prompt_top))

    def reports(self) -> list[dict]:
        def gather() -> list[dict]:
            reports = [None] * self.tensor_parallel_size
            dist.gather_object(self.engine.report(0), reports, dst=0, group=self.group)
            return reports

        return self._replicate(("report",), gather)

    # -- replication and failure ---------------------------------------------
    def _replicate(self, command: tuple, run_here: Callable):
        """Have the driver thread broadcast `command` and then run `run_here`; returns its result. Raises its
        SpecDecError (raised alike on every rank: they stay in step), or Unavailable once the front has failed,
        whether or not the command ran."""
        call = _Command(command, run_here)
        with self._settled:
            if self.failure:
                raise Unavailable(self.failure)
            self._commands.put(call)
            self._settled.wait_for(lambda: call.finished or self.failure is not None)
        if not call.finished:
            raise Unavailable(self.failure)
        if call.error is not None:
            raise call.error
        return call.result

    def _drive(self) -> None:
        """The driver thread: run the commands one at a time, in the order they came."""
        while (call := self._commands.get()) is not None:
            try:
                if self.failure:
                    raise Unavailable(self.failure)
                dist.broadcast_object_list([call.command], src=0, group=self.group)
                self._last_command = time.monotonic()
                call.result = call.run_here()
            except SpecDecError as exc:
                call.error = exc
            except BaseException as exc:  # noqa: BLE001 - a collective failed (a rank is gone), or worse
                self.fail(f"tensor-parallel {self._lost_ranks()}; the collective failed: {exc}")
                call.error = Unavailable(self.failure or f"target unavailable: the service is stopping ({exc})")
                call.error.__cause__ = exc
            with self._settled:
                call.finished = True
                self._settled.notify_all()
            del call  # the result may hold a session's tensors

    def fail(self, reason: str) -> None:
        """Fail the front, once: the callbacks (health's NOT_SERVING) run first, then every call waiting and every
        later one fails, so that no caller sees the failure before they have run (a test once saw a call fail with
        the callbacks not yet run). A second caller returns once the failure is published."""
        with self._settled:
            if self._closed.is_set():
                return
            if self._failing:
                self._settled.wait_for(lambda: self.failure is not None)
                return
            self._failing = True
        failure = f"target unavailable: {reason}; restart the target service"
        log.error("%s", failure)
        try:
            for callback in self.on_failure:
                callback(failure)
        finally:  # published even if a callback raised: callers waiting on it must not wait forever
            with self._settled:
                self.failure = failure
                self._settled.notify_all()  # the calls waiting fail now, whatever their commands are doing

    def _lost_ranks(self, wait_s: float = 2.0) -> str:
        """Which follower is gone, for the error a client sees (gloo's own message names none).

        A rank killed mid-collective breaks the collective before its exit is reaped, so its
        process gets up to `wait_s` to be seen exiting. Followers not started here (Ray) cannot be
        polled: the error then names the ranks that may be at fault.
        """
        deadline = time.monotonic() + wait_s
        while True:
            gone = [(rank, proc.poll()) for rank, proc in self._followers if proc.poll() is not None]
            if gone or not self._followers or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if gone:
            return ", ".join(f"rank {rank} exited with code {code}" for rank, code in gone)
        return f"one of ranks 1..{self.tensor_parallel_size - 1} stopped answering"

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        self.fail(f"tensor-parallel rank {rank} exited with code {code}")

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S / 2):
            if self.failure is None and time.monotonic() - self._last_command > HEARTBEAT_S:
                try:
                    self._replicate(("ping",), lambda: None)
                except Unavailable:
                    pass

    def close(self) -> None:
        """Tell the followers to exit, and stop this rank's engine (shutdown path). Idempotent."""
        if self.failure is None:
            try:
                self._replicate(("stop",), lambda: None)
            except Unavailable:
                pass
        self._closed.set()
        self._commands.put(None)
        self.engine.close()


@dataclass(eq=False)
class _Command:
    """One command for every rank, and what running it on rank 0 gave."""

    command: tuple
    run_here: Callable[[], Any]
    finished: bool = False
    result: Any = None
    error: BaseException | None = field(default=None, repr=False)


def follow(engine: TargetEngine, rank: int, group) -> None:
    """A follower rank's loop: run rank 0's commands until told to stop or rank 0 is gone."""
    calls = {"open": engine.open, "release": engine.release, "score": engine.score, "measure": engine.measure_costs,
             "profile": engine.use_profile, "ping": lambda: None}
    while True:
        box = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=group)
        except Exception as exc:  # noqa: BLE001 - rank 0 exited or the group broke
            log.error("rank %d: lost rank 0 (%s); exiting", rank, exc)
            sys.exit(1)
        name, *args = box[0]
        if name == "stop":
            return
        if name == "report":
            dist.gather_object(engine.report(rank), None, dst=0, group=group)
            continue
        try:
            calls[name](*args)
        except SpecDecError:
            pass  # rank 0 raised the same error and reports it to the client
