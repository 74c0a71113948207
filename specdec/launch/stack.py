"""The embedded local stack: draft and target services as child processes on loopback,
the orchestrator in this process. No Redis, no containers."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

from orchestrator.server import start_orchestrator
from orchestrator.servicer import OrchestratorConfig
from specdec.launch.delay_proxy import DelayProxy
from specdec.runtime.heap import freeze_startup_heap
from specdec.runtime.model_service_config import DRAFT_ONLY, ModelServiceConfig
from specdec.runtime.options import option_argv
from specdec.runtime.server import PARENT_PID_ENV, READY_PREFIX, RunningServer
from specdec.weights.sources import preload_tokenizer

log = logging.getLogger(__name__)
START_TIMEOUT_S = 1800.0  # a first start downloads and converts the packaged weights


@dataclass(frozen=True)
class StackOptions:
    """A local stack. Every setting of a service is its own config's: `service` is what the draft and
    target services share (each is given its model, and profile sizes to the orchestrator's γ_max),
    `orchestrator` the orchestrator's; they reach the children as flags (`option_argv`). The rest is
    the stack's own layout."""

    draft_model: str = "packaged:draft"
    target_model: str = "packaged:target"
    # Its host, log level and telemetry are the orchestrator's too; the grammars' tokenizer is built by the first
    # structured output unless asked for at start-up (`specdec serve` asks).
    service: ModelServiceConfig = ModelServiceConfig(log_level="warning", grammar_warmup="off")
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    port: int = 0  # the orchestrator's (the services take free ports)
    target_tp: int = 1  # tensor-parallel worker processes of the target service
    orchestrator_process: bool = False  # run the orchestrator as a child process too (own telemetry)
    metrics_port: int = 0  # the child orchestrator's Prometheus port (0 = off)
    draft_replicas: int = 1
    delay_proxies: bool = False  # route both hops through loopback delay proxies (network emulation)
    security_flags: tuple[str, ...] = ()  # --auth-token-file/--tls-* for every child (`specdec.runtime.security`)
    # CPUs each service is pinned to, as taskset writes them ("1", "0,2-3"; empty: not pinned), with one
    # torch thread per CPU: on one machine, what stands in for separate machines.
    draft_cpus: str = ""
    target_cpus: str = ""

    @property
    def host(self) -> str:
        return self.service.host

    @property
    def redis_url(self) -> str:
        """Distributed mode: drafts register there, the orchestrator routes through it."""
        return self.service.redis_url

    def service_argv(self, model: str, cpus: str = "", draft: bool = True) -> list[str]:
        """A model service's flags; pinned to `cpus`, it runs one torch thread per CPU."""
        config = dataclasses.replace(self.service, model=model, profile_tokens=self.orchestrator.gamma_max + 1,
                                     threads=len(cpu_list(cpus)) if cpus else self.service.threads)
        return option_argv(config, skip=() if draft else DRAFT_ONLY)

    def orchestrator_argv(self, draft_route: str, target_route: str) -> list[str]:
        """An orchestrator process's flags, in front of the services at these routes."""
        server = option_argv(self.service, only=("host", "log_level", "otlp_endpoint", "trace_file",
                                                 "keepalive_s"))
        return ["--draft", draft_route, "--target", target_route, "--tokenizer", self.target_model, *server,
                *option_argv(self.orchestrator), "--metrics-port", str(self.metrics_port),
                *(["--redis-url", self.redis_url] if self.redis_url else [])]


class ServiceProcess:
    """A service child process; `port` is read from the ready line it prints."""

    def __init__(self, module: str, argv: list[str], opts: StackOptions, port: int = 0, cpus: str = ""):
        cmd = [sys.executable, "-m", module, *opts.security_flags, *argv, "--port", str(port)]
        self.module, self.argv, self.cpus = module, argv, cpus
        self.host = "127.0.0.1" if opts.host in ("0.0.0.0", "::", "[::]") else opts.host
        env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid())}  # the child ends with us
        if cpus:  # util-linux's taskset: the process is pinned before its first instruction
            cmd = ["taskset", "-c", cpus, *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        self.port: int | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(READY_PREFIX):
                self.port = int(line[len(READY_PREFIX):])
                self._ready.set()
            else:  # keep our stdout for results (--json)
                sys.stderr.write(line)
        self._ready.set()  # exited

    def wait_ready(self, timeout: float) -> str:
        if not self._ready.wait(timeout) or self.port is None:
            self.stop()
            raise RuntimeError(f"{self.module} did not become ready (exit code {self.proc.poll()}); see its log above")
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self.terminate()
        self.wait_stopped()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def wait_stopped(self, timeout_s: float = 10.0) -> None:
        """Wait for the exit that `terminate` asked for; past `timeout_s`, kill."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_list(spec: str) -> set[int]:
    """taskset's CPU list: "0,2-3" -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


class ManagedStack:
    """A context manager over `start()` / `stop()`: a start that fails still stops what it started. Once
    started, this process's heap is frozen (`freeze_startup_heap`): its orchestrator serves from here."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def drain(self, timeout_s: float, hurry: threading.Event | None = None) -> None:
        """Drain the orchestrator (`RunningServer.drain`): new calls refused, those in flight given `timeout_s`;
        `stop` then stops the rest, whose calls have ended with the orchestrator's."""
        orchestrator: RunningServer | None = getattr(self, "orchestrator", None)
        if orchestrator is not None:
            orchestrator.drain(timeout_s, hurry)

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        freeze_startup_heap()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class EmbeddedStack(ManagedStack):
    """Context manager: `with EmbeddedStack(opts) as stack: stack.endpoint`."""

    def __init__(self, opts: StackOptions):
        self.opts = opts
        self.draft: ServiceProcess | None = None
        self.target: ServiceProcess | None = None
        self.orchestrator: RunningServer | None = None
        self.orchestrator_child: ServiceProcess | None = None
        self.drafts: list[ServiceProcess] = []
        self.draft_proxy: DelayProxy | None = None
        self.target_proxy: DelayProxy | None = None

    def start(self) -> None:
        opts = self.opts
        # Each child fetches and converts its own packaged weights on first use (a file lock keeps them apart).
        if opts.draft_replicas < 1 and opts.orchestrator.proposer == "model":
            raise ValueError("a stack without draft replicas drafts by lookup only: set proposer ngram or hybrid")
        self.drafts = [ServiceProcess("draft_service", opts.service_argv(opts.draft_model, opts.draft_cpus), opts,
                                      cpus=opts.draft_cpus)
                       for _ in range(opts.draft_replicas)]
        self.draft = self.drafts[0] if self.drafts else None
        target_argv = [*opts.service_argv(opts.target_model, opts.target_cpus, draft=False), "--tp", str(opts.target_tp)]
        self.target = ServiceProcess("target_service", target_argv, opts, cpus=opts.target_cpus)
        # The orchestrator's tokenizer loads while the services load (a packaged one, once fetched).
        preloaded = preload_tokenizer(opts.target_model) if not opts.orchestrator_process else lambda: None
        self.draft_addresses = [d.wait_ready(START_TIMEOUT_S) for d in self.drafts]
        self.draft_address = self.draft_addresses[0] if self.draft_addresses else ""
        self.target_address = self.target.wait_ready(START_TIMEOUT_S)
        # With Redis the orchestrator finds the replicas in the registry; without, it is given them.
        draft_route = "" if opts.redis_url else ",".join(self.draft_addresses)
        target_route = self.target_address
        if opts.delay_proxies:
            if opts.redis_url or opts.draft_replicas != 1:
                raise ValueError("delay proxies support one draft replica given by address")
            self.draft_proxy = DelayProxy(self.draft.host, self.draft.port).start()
            self.target_proxy = DelayProxy(self.target.host, self.target.port).start()
            draft_route, target_route = self.draft_proxy.address, self.target_proxy.address
        if opts.orchestrator_process:
            self.orchestrator_child = ServiceProcess("orchestrator", opts.orchestrator_argv(draft_route, target_route),
                                                     opts, port=opts.port)
            self.orchestrator_child.wait_ready(START_TIMEOUT_S)
        else:
            self.orchestrator = self.start_another_orchestrator(opts.port, preloaded())
        log.info("draft %s, target %s, orchestrator %s", self.draft_address, self.target_address, self.endpoint)

    def start_another_orchestrator(self, port: int = 0, tokenizer=None) -> RunningServer:
        """An orchestrator in this process over the same services (and Redis, if any); `tokenizer`: the target
        model's, loaded already (each orchestrator's own: a fast tokenizer is not shared between threads)."""
        opts = self.opts
        draft_route = "" if opts.redis_url else ",".join(self.draft_addresses)
        if self.draft_proxy is not None:
            draft_route = self.draft_proxy.address
        target_route = self.target_proxy.address if self.target_proxy is not None else self.target_address
        return start_orchestrator(draft_route, target_route, opts.target_model, opts.host, port,
                                  opts.orchestrator, opts.redis_url, keepalive_s=opts.service.keepalive_s,
                                  tokenizer=tokenizer)

    @property
    def endpoint(self) -> str:
        port = self.orchestrator_child.port if self.orchestrator_child else self.orchestrator.port
        return f"{self.opts.host}:{port}"

    def set_rtt_ms(self, draft_rtt_ms: float, target_rtt_ms: float, jitter_ms: float = 0.0) -> None:
        """Round-trip delay added on each hop (needs `delay_proxies`); each direction gets half."""
        for proxy, rtt in ((self.draft_proxy, draft_rtt_ms), (self.target_proxy, target_rtt_ms)):
            proxy.delay_ms, proxy.jitter_ms = rtt / 2, jitter_ms / 2

    def kill_draft(self) -> None:
        self.draft.proc.kill()
        self.draft.proc.wait()

    def restart_draft(self) -> None:
        """Start a new draft process on the old port, so the orchestrator's channel reaches it again."""
        self.draft = self.drafts[0] = ServiceProcess("draft_service", self.draft.argv, self.opts, port=self.draft.port,
                                                     cpus=self.draft.cpus)
        self.draft.wait_ready(START_TIMEOUT_S)

    def stop(self) -> None:
        if self.orchestrator is not None:
            self.orchestrator.stop(grace=1.0)
        for proxy in (self.draft_proxy, self.target_proxy):
            if proxy is not None:
                proxy.stop()
        children = [proc for proc in (self.orchestrator_child, *self.drafts, self.target) if proc is not None]
        for proc in children:  # all at once: each drains on its own
            proc.terminate()
        for proc in children:
            proc.wait_stopped()
