"""Shared fixtures: tiny-model embedded stacks (real processes on loopback), one per compute path."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import torch

if not torch.cuda.is_available():  # before any import reaches Triton (transformers' LlamaConfig does): the pool
    os.environ.setdefault("TRITON_INTERPRET", "1")  # attention's tests then run its kernels in Triton's interpreter

import openai  # noqa: E402
import pytest
import redis

from orchestrator.clients import draft_client, target_client
from orchestrator.servicer import OrchestratorConfig
from specdec.launch.stack import EmbeddedStack, StackOptions
from specdec.runtime.model_service_config import ModelServiceConfig
from specdec.runtime.server import PARENT_PID_ENV, READY_PREFIX, free_port

TINY_TARGET = "tiny:seed=0"
TINY_DRAFT = "tiny:seed=0,perturb=0.05"  # agrees with the target on about half the tokens
# GGUF sources (weights quantized as a Q4_K_M file's are; 256 wide, so Q4_K and Q6_K blocks): on CPU
# their default path is "gguf-q8" (integer dots), `dtype: gguf` the exact one, `dtype: float32` the
# same dequantized weights on fp32.
GGUF_TARGET = "tiny:seed=0,hidden=256,gguf=1"
GGUF_DRAFT = "tiny:seed=0,hidden=256,gguf=1,perturb=0.05"
PATH_SERVICE = {"fp32": {}, "bf16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"}, "gguf": {"dtype": "gguf"},
                "gguf-q8": {}}
# Test stacks draft with the model and never overlap unless a request says otherwise: their tests are
# about the draft model's rounds, which lookups of earlier tests' outputs (the server's default, hybrid)
# would replace. The defaults have tests of their own (test_ngram, test_overlap).
MODEL_DRAFTING = dict(proposer="model", overlap="off")


def tiny_models(path: str) -> tuple[str, str]:
    """(draft, target) specs for a compute path's tests."""
    return (GGUF_DRAFT, GGUF_TARGET) if path.startswith("gguf") else (TINY_DRAFT, TINY_TARGET)


def tiny_options(draft: str = TINY_DRAFT, target: str = TINY_TARGET, service: dict | None = None,
                 orchestrator: dict | None = None, **stack) -> StackOptions:
    """A stack of tiny models (on CPU unless `service` names a device) with γ_max 6, drafting with the model (`MODEL_DRAFTING`); `service`
    and `orchestrator` set fields of those configs, `stack` of StackOptions."""
    return StackOptions(draft_model=draft, target_model=target,
                        service=ModelServiceConfig(**{"device": "cpu", "log_level": "warning", "grammar_warmup": "off",
                                                      **(service or {})}),
                        orchestrator=OrchestratorConfig(**{"gamma_max": 6, **MODEL_DRAFTING, **(orchestrator or {})}),
                        **stack)


LETTERS = {str(t): 100 for t in range(ord("a"), ord("z") + 1)}  # a logit bias with no EOS: a reply runs to its length


@contextlib.contextmanager
def slow_target_stack(rtt_ms: float = 40.0):
    """A tiny stack whose target is `rtt_ms` away: a target-only round is a round trip, so a reply of N tokens
    takes at least N × `rtt_ms`, long enough to act on while it runs."""
    with EmbeddedStack(tiny_options(delay_proxies=True, orchestrator=dict(target_chunk_ms=0.0))) as stack:
        stack.set_rtt_ms(0, rtt_ms)
        yield stack


def tiny_stack(path: str = "fp32") -> EmbeddedStack:
    draft, target = tiny_models(path)
    return EmbeddedStack(tiny_options(draft, target, service=PATH_SERVICE[path],
                                      orchestrator=dict(max_new_tokens_limit=1024)))


@pytest.fixture(scope="session")
def stack():
    with tiny_stack() as running:
        yield running


@pytest.fixture(scope="session")
def int8_stack():
    with tiny_stack("int8") as running:
        yield running


@pytest.fixture(scope="session")
def gguf_stack():
    with tiny_stack("gguf") as running:
        yield running


@pytest.fixture(scope="session")
def gguf_q8_stack():
    with tiny_stack("gguf-q8") as running:
        yield running


# Each compute path's stack fixture (bf16's is test_paths_e2e's own).
PATH_STACKS = {"fp32": "stack", "bf16": "bf16_stack", "int8": "int8_stack", "gguf": "gguf_stack",
               "gguf-q8": "gguf_q8_stack"}


def stack_on(request, path: str) -> EmbeddedStack:
    """The running tiny stack of `path` (its fixture, started on first use)."""
    return request.getfixturevalue(PATH_STACKS[path])


def pytest_configure(config):
    """Measured cost profiles go to a folder of this process's own (the services inherit it; each xdist worker
    has its own), never to the user's weights cache: every run starts by measuring, as a fresh machine does. The
    kernel builds come first, in the process that starts the workers, so that no test pays for one."""
    import os
    import tempfile

    os.environ["SPECDEC_PROFILE_CACHE"] = tempfile.mkdtemp(prefix="specdec-profiles-")
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller built every kernel before it started the workers
    from specdec.engine.cpu import native

    try:  # every kernel build this CPU runs, two compilers at once, before the tests that load them
        native.build_every_runnable()
    except native.KernelUnavailable:
        pass  # the tests that need a kernel say why


def pytest_unconfigure(config):
    """The run's profile folder goes with it (every service that wrote there has stopped)."""
    import os
    import shutil

    folder = os.environ.pop("SPECDEC_PROFILE_CACHE", None)
    if folder is not None and os.path.basename(folder).startswith("specdec-profiles-"):
        shutil.rmtree(folder, ignore_errors=True)


def wait_until(condition, timeout_s: float, what: str, every_s: float = 0.05) -> None:
    """Poll `condition()` until it holds; fail after `timeout_s` naming `what` (a bounded wait, not a sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout_s} s waiting for {what}"
        time.sleep(every_s)


def holds_for(condition, seconds: float, what: str, every_s: float = 0.05) -> None:
    """Check `condition()` throughout `seconds`, failing at the first moment it does not hold."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert condition(), f"{what} stopped holding"
        time.sleep(every_s)


def set_fields(message, **fields):
    """`message` with `fields` set: a list extends a repeated field, anything else is assigned. Returns it."""
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message


def assert_speculated(result, what: str = "") -> None:
    """A greedy-identity claim means something only if drafts were accepted: a path whose draft never
    agreed with the target would run target-only and match trivially."""
    stats = result.stats
    assert stats["draft_tokens"] > 0 and stats["accepted_tokens"] > 0, \
        f"no draft was accepted {what}: {stats['draft_tokens']} drafted, {stats['accepted_tokens']} accepted"


def assert_pieces_keep_their_rows(runner) -> None:
    """A static runner's pass of 8 steps of rows + 1 tokens, every row's logits asked for: 16 segments, two
    pieces of 8 sessions, one graph replayed twice on CUDA, whose output the second replay overwrites. Each
    step must get its own rows, the bits of its step alone."""
    import torch

    from specdec.engine.runner import Step

    caches = [runner.new_cache() for _ in range(8)]
    blocks = [[(3 * i + j) % 200 + 1 for j in range(runner.rows + 1)] for i in range(8)]
    for i, cache in enumerate(caches):
        runner.forward([Step(cache, list(range(40 + i, 75)))])
    together = runner.forward([Step(cache, block, logits=len(block)) for cache, block in zip(caches, blocks)])
    for i, (cache, block) in enumerate(zip(caches, blocks)):
        cache.length -= len(block)
        alone = runner.forward([Step(cache, block, logits=len(block))])[0]
        assert torch.equal(together[i], alone), f"step {i} got other rows than its own"


class Worker(threading.Thread):
    """A thread whose exception is raised again by `join()` instead of being lost."""

    def __init__(self, target, *args):
        super().__init__(target=target, args=args)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        assert not self.is_alive(), f"thread {self.name} still running after {timeout} s"
        if self.error is not None:
            raise self.error


def choices(endpoint: str, request, n: int) -> list[tuple[list[int], list, object]]:
    """`request` asked for `n` choices: each choice's (tokens, logprobs, final GenerationStats), in choice order."""
    import grpc

    from protos import specdec_pb2_grpc as pb_grpc
    from specdec.runtime.server import CHANNEL_OPTIONS

    request.n = n
    tokens, logprobs, stats = [[] for _ in range(n)], [[] for _ in range(n)], [None] * n
    with grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
        for message in pb_grpc.SpecDecStub(channel).Generate(request, timeout=120):
            tokens[message.choice] += message.token_ids
            logprobs[message.choice] += message.logprobs
            if message.HasField("stats"):
                assert stats[message.choice] is None, "one final message per choice"
                stats[message.choice] = message.stats
    assert all(s is not None for s in stats)
    return list(zip(tokens, logprobs, stats, strict=True))


def refusal(endpoint: str, request):
    """The grpc.RpcError a Generate call of `request` ends with (the test fails if it ends without one)."""
    import grpc

    from protos import specdec_pb2_grpc as pb_grpc
    from specdec.runtime.server import CHANNEL_OPTIONS

    with grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(pb_grpc.SpecDecStub(channel).Generate(request, timeout=30))
    return caught.value


def count_fed(runner) -> list[int]:
    """From now on, the tokens `runner` is fed per forward pass (appended to the list returned)."""
    fed, forward = [], runner.forward
    runner.forward = lambda steps: fed.append(sum(len(s.tokens) for s in steps)) or forward(steps)
    return fed


class Serve:
    """`specdec serve --http-port 0` as a child process; its endpoints read from its stdout."""

    def __init__(self, *flags: str, draft: str = TINY_DRAFT, target: str = TINY_TARGET):
        cmd = [sys.executable, "-m", "specdec.cli.main", "serve", "--draft-model", draft, "--target-model", target,
               "--device", "cpu", "--port", "0", "--gamma-max", "6", "--max-new-tokens-limit", "1024",
               "--http-port", "0", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines = {}
        for line in self.proc.stdout:  # until all three lines are in, or the process ended
            for key, pattern in (("grpc", r"specdec serving on (\S+)"), ("services", r"services: draft (\S+), target (\S+)"),
                                 ("http", r"OpenAI-compatible API on (\S+)")):
                if (match := re.search(pattern, line)):
                    lines[key] = match.groups()
            if len(lines) == 3:
                break
        assert len(lines) == 3, f"specdec serve did not start (exit {self.proc.poll()})"
        self.grpc, = lines["grpc"]
        self.draft, self.target = lines["services"]
        self.base_url, = lines["http"]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def live(self) -> tuple[int, int]:
        """(target, draft) sessions open on the services."""
        target, draft = target_client(self.target), draft_client(self.draft)
        try:
            return target.info().live_sessions, draft.info().live_sessions
        finally:
            target.close(), draft.close()

    def wait_idle(self, timeout_s: float = 15.0) -> tuple[int, int]:
        """Wait for no session to be open on either service; the last count seen."""
        deadline = time.monotonic() + timeout_s
        while (live := self.live()) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        return live

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def serve():
    """`specdec serve --http-port` on the tiny pair, admitting 2 generations at once: one per test module that
    asks for it (the HTTP API's tests)."""
    running = Serve("--max-concurrent", "2")
    yield running
    running.stop()


def start_gateway(endpoint: str, *flags: str) -> tuple[subprocess.Popen, str]:
    """A standalone `python -m specdec.http` in front of the orchestrator at `endpoint`: (its process, its
    base URL ending in /v1). It ends with this process, as a launcher's children do (a test run killed midway
    left one behind)."""
    proc = subprocess.Popen([sys.executable, "-m", "specdec.http", "--endpoint", endpoint, "--http-host", "127.0.0.1",
                             "--http-port", "0", "--log-level", "warning", *flags], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, PARENT_PID_ENV: str(os.getpid())})
    port = next((int(line[len(READY_PREFIX):]) for line in proc.stdout if line.startswith(READY_PREFIX)), None)
    assert port is not None, f"python -m specdec.http did not start (exit {proc.wait(30)})"
    return proc, f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def redis_server():
    """A redis-server of its own on a free loopback port: its URL."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed (scripts/setup.sh installs Debian's package)"
    port = free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)

    def answers() -> bool:
        try:
            return client.ping()
        except redis.ConnectionError:
            return False

    try:
        wait_until(answers, 20, "redis-server to start", every_s=0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)
