"""`specdec serve --ray`: draft replicas and the target's tensor-parallel ranks as Ray actors.

Each service process runs under a `ServiceActor`, placed by Ray through placement groups:
the draft replicas spread over nodes (one bundle each), the target's ranks packed onto one node
(one bundle, and on GPU clusters one GPU, per rank). Rank 0 of the target is started with
`--tp-external-workers`: it does not spawn its followers, which Ray places as actors of their
own and which join it at `--tp-master`. The orchestrator runs in this (driver) process.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from orchestrator.server import start_orchestrator
from specdec.launch.stack import ManagedStack, ServiceProcess, StackOptions
from specdec.runtime.server import RunningServer

log = logging.getLogger(__name__)
START_TIMEOUT_S = 1800.0
RAY_START_ATTEMPTS = 3  # a local Ray's raylet must register within a fixed 30 s, which a busy machine can miss


def init_ray(address: str, attempts: int = RAY_START_ATTEMPTS, **init) -> None:
    """`ray.init`, retried from scratch when a local start times out (Ray's start-up wait is fixed).

    A local Ray runs its workers at normal priority: they host the services, which are the workload,
    and Ray's default (niceness 15) lets any other load on the machine starve them.
    """
    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address or None, **init)
            return
        except Exception as error:  # Ray raises a bare Exception for a node start-up timeout
            ray.shutdown()
            if attempt == attempts:
                raise
            log.warning("ray: start-up attempt %d of %d failed (%s); retrying", attempt, attempts, error)


class ServiceActor:
    """Runs one service process (a `ServiceProcess`) on the node Ray placed this actor on."""

    def __init__(self):
        self.service: ServiceProcess | None = None

    def node_ip(self) -> str:
        """The address Ray knows this actor's node by (what other nodes reach it at)."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)

    def free_port(self) -> int:
        from specdec.runtime.server import free_port

        return free_port()  # the ranks rendezvous over this node's loopback

    def start(self, module: str, argv: list[str], opts: StackOptions, wait_ready: bool = True) -> int:
        """Start the service listening on all interfaces; returns its port (0 if not waited for)."""
        everywhere = dataclasses.replace(opts, service=dataclasses.replace(opts.service, host="0.0.0.0"))
        self.service = ServiceProcess(module, [*argv, "--host", "0.0.0.0"], everywhere)
        if not wait_ready:
            return 0
        self.service.wait_ready(START_TIMEOUT_S)
        return self.service.port

    def pid(self) -> int:
        return self.service.proc.pid if self.service else 0

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


class RayStack(ManagedStack):
    """Like EmbeddedStack, with every service process placed by Ray. Context manager."""

    def __init__(self, opts: StackOptions, ray_address: str = "", draft_replicas: int = 1,
                 cpus_per_process: float = 1.0, gpus_per_process: float = 0.0, ray_init: dict | None = None):
        self.opts, self.ray_address, self.draft_replicas = opts, ray_address, draft_replicas
        self.cpus, self.gpus, self.ray_init = cpus_per_process, gpus_per_process, ray_init or {}
        self.actors: list = []
        self.placement_groups: list = []
        self.orchestrator: RunningServer | None = None

    def _bundle(self) -> dict:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def _actors(self, count: int, strategy: str) -> list:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group([self._bundle()] * count, strategy=strategy)
        ray.get(group.ready(), timeout=120)
        self.placement_groups.append(group)
        remote = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus)(ServiceActor)
        actors = [remote.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote() for i in range(count)]
        self.actors.extend(actors)
        return actors

    def start(self) -> None:
        import ray

        if not ray.is_initialized():
            init_ray(self.ray_address, **self.ray_init)
        opts = self.opts
        # The target first: its ranks on one node (nccl/gloo between them), rank 0 serving gRPC.
        ranks = self._actors(opts.target_tp, "STRICT_PACK")
        target_argv = [*opts.service_argv(opts.target_model, draft=False), "--tp", str(opts.target_tp)]
        here = ray.util.get_node_ip_address()  # a service on the driver's own node is reached over loopback
        reach = lambda ip: "127.0.0.1" if ip == here else ip  # noqa: E731
        target_ip = reach(ray.get(ranks[0].node_ip.remote()))
        pending = []
        if opts.target_tp > 1:
            # STRICT_PACK puts every rank on one node, so they rendezvous over its loopback.
            master = f"127.0.0.1:{ray.get(ranks[0].free_port.remote())}"
            target_argv += ["--tp-master", master, "--tp-external-workers"]
            pending = [rank.start.remote("target_service", [*target_argv, "--tp-rank", str(r)], opts, False)
                       for r, rank in enumerate(ranks[1:], start=1)]
        target_port = ray.get(ranks[0].start.remote("target_service", target_argv, opts), timeout=START_TIMEOUT_S)
        ray.get(pending)
        self.target_address = f"{target_ip}:{target_port}"
        drafts = self._actors(self.draft_replicas, "SPREAD")
        ports = ray.get([d.start.remote("draft_service", opts.service_argv(opts.draft_model), opts) for d in drafts],
                        timeout=START_TIMEOUT_S)
        ips = [reach(ip) for ip in ray.get([d.node_ip.remote() for d in drafts])]
        self.draft_addresses = [f"{ip}:{port}" for ip, port in zip(ips, ports)]
        draft_route = "" if opts.redis_url else ",".join(self.draft_addresses)
        self.orchestrator = start_orchestrator(draft_route, self.target_address, opts.target_model, opts.host,
                                               opts.port, opts.orchestrator, opts.redis_url,
                                               keepalive_s=opts.service.keepalive_s)
        log.info("ray: drafts %s, target %s (tp=%d), orchestrator %s", self.draft_addresses, self.target_address,
                 opts.target_tp, self.endpoint)

    @property
    def endpoint(self) -> str:
        return f"{self.opts.host}:{self.orchestrator.port}"

    def stop(self) -> None:
        import ray

        if self.orchestrator is not None:
            self.orchestrator.stop(grace=1.0)
        if not ray.is_initialized():
            return
        ray.get([actor.stop.remote() for actor in self.actors], timeout=60)
        for actor in self.actors:
            ray.kill(actor)
        from ray.util.placement_group import remove_placement_group

        for group in self.placement_groups:
            remove_placement_group(group)
        self.actors, self.placement_groups = [], []
