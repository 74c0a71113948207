"""Deployment files, validated as far as this machine allows (no image registry): the compose
files against the compose spec and by docker-compose, every Kubernetes manifest by
kubernetes-validate --strict, and every command, flag and env var they name against the CLI."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from draft_service.__main__ import build_parser as draft_parser
from orchestrator.__main__ import build_parser as orchestrator_parser
from specdec.http.__main__ import build_parser as http_parser
from target_service.__main__ import build_parser as target_parser

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = [ROOT / "docker-compose.yml", ROOT / "docker-compose.gpu.yml", ROOT / "docker-compose.secure.yml"]
K8S = ROOT / "deploy" / "k8s"
RAY_CLUSTER = ROOT / "deploy" / "ray" / "raycluster.yaml"
PARSERS = {"draft_service": draft_parser, "target_service": target_parser, "orchestrator": orchestrator_parser,
           "specdec.http": http_parser, "specdec.runtime.healthcheck": None}
# Env vars read by libraries rather than by our code: the OpenTelemetry SDK's standard settings.
STANDARD_ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
                "COLLECTOR_OTLP_ENABLED", "POD_IP", "RAY_ADDRESS"}


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def k8s_documents() -> list[tuple[Path, dict]]:
    """Every resource of the base and the KubeRay cluster, and the kustomizations (not the overlay patches)."""
    docs = []
    paths = [*sorted((K8S / "base").glob("*.yaml")), RAY_CLUSTER, *sorted(K8S.rglob("kustomization.yaml"))]
    for path in dict.fromkeys(paths):
        if path.name != "otel-collector-config.yaml":
            docs.extend((path, d) for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def containers_of(doc: dict) -> list[dict]:
    """Every container spec in a compose service or a Kubernetes workload (RayCluster included)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    found.extend(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    return found


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_compose_file_matches_the_compose_spec(path):
    result = run([str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
                  str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("files", [COMPOSE[:1], COMPOSE[:2], [COMPOSE[0], COMPOSE[2]]],
                         ids=["cpu", "gpu-override", "secure-override"])
def test_docker_compose_accepts_the_files(files, tmp_path):
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (scripts/setup.sh installs Debian's package)"
    secrets = ROOT / "deploy" / "secrets"
    made = not secrets.exists() and COMPOSE[2] in files
    if made:  # the secure override names secret files that scripts/make-secrets.sh writes
        subprocess.run(["bash", str(ROOT / "scripts" / "make-secrets.sh"), str(secrets)], check=True,
                       capture_output=True)
    try:
        result = run([binary, *[a for f in files for a in ("-f", str(f))], "config", "-q"])
    finally:
        if made:
            shutil.rmtree(secrets)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_layout():
    services = yaml.safe_load(COMPOSE[0].read_text())["services"]
    assert {"redis", "otel-collector", "jaeger", "draft-1", "draft-2", "target", "orchestrator"} <= set(services)
    assert "--tp" in services["target"]["command"] and services["target"]["command"][-1] == "2"
    for name in ("draft-1", "draft-2", "target", "orchestrator", "redis"):
        assert "healthcheck" in services[name], name
    for dep in ("draft-1", "draft-2", "target", "redis"):
        assert services["orchestrator"]["depends_on"][dep]["condition"] == "service_healthy"
    gpu = yaml.safe_load(COMPOSE[1].read_text())["services"]["target"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2


def test_kubernetes_manifests_validate_strictly(tmp_path):
    files = [p for p in sorted(K8S.rglob("*.yaml")) if p.name != "kustomization.yaml"
             and p.parent.parent.name != "overlays" and p.name != "otel-collector-config.yaml"]
    # The overlays' patches, applied to their base resources the way kustomize merges them.
    base = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_documents() if "metadata" in d}
    for patch_path in sorted((K8S / "overlays").glob("*/*-*.yaml")):
        patch = yaml.safe_load(patch_path.read_text())
        merged = strategic_merge(copy.deepcopy(base[(patch["kind"], patch["metadata"]["name"])]), patch)
        out = tmp_path / f"{patch_path.parent.name}-{patch_path.name}"
        out.write_text(yaml.safe_dump(merged))
        files.append(out)
    # KubeRay's CRD has no schema here: validate its pod templates as PodTemplates.
    cluster = yaml.safe_load(RAY_CLUSTER.read_text())
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for i, group in enumerate(groups):
        out = tmp_path / f"ray-template-{i}.yaml"
        out.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "PodTemplate",
                                       "metadata": {"name": f"ray-{i}"}, "template": group["template"]}))
        files.append(out)
    validator = str(Path(sys.executable).parent / "kubernetes-validate")
    result = run([validator, "--strict", "--quiet", *map(str, files)])
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yaml"  # the validator does reject a bad manifest
    broken.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n")
    assert run([validator, "--strict", "--quiet", str(broken)]).returncode != 0


def strategic_merge(base: dict, patch: dict) -> dict:
    """Kustomize's strategic merge for what our patches use: maps merge, named lists merge by name."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            strategic_merge(base[key], value)
        elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value) \
                and isinstance(base.get(key), list):
            by_name = {item.get("name"): item for item in base[key]}
            for item in value:
                if item["name"] in by_name:
                    strategic_merge(by_name[item["name"]], item)
                else:
                    base[key].append(item)
        else:
            base[key] = value
    return base


def test_kubernetes_layout():
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in k8s_documents() if "metadata" in d}
    for needed in [("Deployment", "draft"), ("HorizontalPodAutoscaler", "draft"), ("StatefulSet", "target"),
                   ("Deployment", "orchestrator"), ("Service", "orchestrator"), ("Deployment", "redis"),
                   ("Deployment", "otel-collector"), ("PodDisruptionBudget", "draft"), ("RayCluster", "specdec")]:
        assert needed in kinds, needed
    policies = {d["metadata"]["name"]: d for _, d in k8s_documents() if d["kind"] == "NetworkPolicy"}
    for name, app in (("draft-from-orchestrator", "specdec-draft"), ("target-from-orchestrator", "specdec-target")):
        spec = policies[name]["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == app
        assert [f["podSelector"]["matchLabels"] for rule in spec["ingress"] for f in rule["from"]] == \
               [{"app.kubernetes.io/name": "specdec-orchestrator"}]
    for path, doc in k8s_documents():
        for container in containers_of(doc):
            if container.get("image") == "specdec":
                assert "resources" in container and "limits" in container["resources"], (path, container["name"])
                if doc["kind"] != "RayCluster":
                    assert "grpc" in container["livenessProbe"]
                    assert "grpc" in container["readinessProbe"] or container["name"] == "orchestrator"


def test_the_openai_api_is_exposed_and_probed_everywhere():
    """Compose, the k8s base and its secure overlay serve the HTTP API on :8000, probed on /health."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["orchestrator"]
    assert compose["command"][compose["command"].index("--http-port") + 1] == "8000" and "8000:8000" in compose["ports"]
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_documents() if "metadata" in d}
    (container,) = containers_of(docs[("Deployment", "orchestrator")])
    assert container["args"][container["args"].index("--http-port") + 1] == "8000"
    assert {"name": "http", "containerPort": 8000} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert {"name": "http", "port": 8000, "targetPort": "http"} in docs[("Service", "orchestrator")]["spec"]["ports"]
    patch = yaml.safe_load((K8S / "overlays" / "secure" / "orchestrator-secure.yaml").read_text())
    merged = strategic_merge(copy.deepcopy(docs[("Deployment", "orchestrator")]), patch)
    (secure,) = containers_of(merged)
    assert secure["readinessProbe"] == {"httpGet": {"path": "/health", "port": "http", "scheme": "HTTPS"},
                                        "periodSeconds": 5}


def drain_of(argv: list[str]) -> float:
    """The drain a server's command line asks for (`--drain-timeout-s`, or its default)."""
    from specdec.runtime.server import DRAIN_TIMEOUT_S

    return float(argv[argv.index("--drain-timeout-s") + 1]) if "--drain-timeout-s" in argv else DRAIN_TIMEOUT_S


def test_every_server_is_given_time_to_drain_before_it_is_killed():
    """Compose's stop_grace_period and each k8s pod's terminationGracePeriodSeconds outlast the drain of the server
    they run, and the end of its cut calls (`RunningServer.drain`), with 5 s to spare: else the kill comes first."""
    from specdec.runtime.server import CUT_WAIT_S

    def seconds(text: str) -> float:
        return float(text.removesuffix("s"))

    for path in COMPOSE:
        for name, service in yaml.safe_load(path.read_text())["services"].items():
            argv = list(service.get("command", []))
            if argv[:2] == ["python", "-m"]:
                assert seconds(service.get("stop_grace_period", "10s")) >= drain_of(argv) + CUT_WAIT_S + 5, (path, name)
    pods = 0
    for path, doc in k8s_documents():
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            argv = [*container.get("command", []), *container.get("args", [])]
            if argv[:2] == ["python", "-m"]:
                pods += 1
                assert pod.get("terminationGracePeriodSeconds", 30) >= drain_of(argv) + CUT_WAIT_S + 5, path.name
    assert pods == 3  # draft, target, orchestrator


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every container that runs one of our modules."""
    found = []
    for path in COMPOSE:
        for name, service in yaml.safe_load(path.read_text())["services"].items():
            if "command" in service:
                found.append((f"{path.name}:{name}", list(service["command"])))
            for probe in [service.get("healthcheck", {}).get("test", [])]:
                if probe[:1] == ["CMD"]:
                    found.append((f"{path.name}:{name}:healthcheck", probe[1:]))
    for path, doc in k8s_documents():
        for container in containers_of(doc):
            argv = [*container.get("command", []), *container.get("args", [])]
            if argv:
                found.append((f"{path.name}:{container['name']}", argv))
    return [(where, argv) for where, argv in found if argv[:2] == ["python", "-m"]]


def test_every_command_and_flag_exists_in_the_cli():
    checked = set()
    for where, argv in commands():
        module, rest = argv[2], argv[3:]
        assert module in PARSERS, f"{where}: unknown module {module}"
        if PARSERS[module] is None:
            from specdec.runtime.healthcheck import main as healthcheck_main  # noqa: F401 - importable
            continue
        parser = PARSERS[module]()
        try:
            parser.parse_args(rest)
        except SystemExit as exc:
            pytest.fail(f"{where}: `{' '.join(argv)}` is refused by the CLI ({exc})")
        checked.add(module)
    assert checked == {"draft_service", "target_service", "orchestrator"}


def test_every_env_var_named_is_read_by_the_code():
    names = set()
    for path in COMPOSE:
        for service in yaml.safe_load(path.read_text())["services"].values():
            env = service.get("environment", {})
            names |= set(env if isinstance(env, dict) else [e.split("=")[0] for e in env])
    for _, doc in k8s_documents():
        for container in containers_of(doc):
            names |= {e["name"] for e in container.get("env", [])}
        if doc["kind"] == "Kustomization":
            for generator in doc.get("configMapGenerator", []):
                names |= {lit.split("=")[0] for lit in generator.get("literals", [])}
    # Compose's own interpolation variables (read by compose, not by us) must each carry a default.
    for path in COMPOSE:
        for name, default in re.findall(r"\$\{(\w+)(:-[^}]*)?\}", path.read_text()):
            assert default, f"{path.name}: ${{{name}}} has no default"
    source = "\n".join(p.read_text() for pkg in ("specdec", "orchestrator", "draft_service", "target_service")
                       for p in (ROOT / pkg).rglob("*.py"))
    source += (ROOT / "deploy" / "Dockerfile").read_text()
    unknown = {n for n in names - STANDARD_ENV if n not in source}
    assert not unknown, f"env vars named in deployment files but read nowhere: {sorted(unknown)}"
    assert {"SPECDEC_REDIS_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"} <= names


def test_dockerfile_has_variants_a_non_root_user_and_a_grpc_health_check():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M) and "cuda)" in text
    assert re.search(r"^USER 10001$", text, re.M)
    assert "HEALTHCHECK" in text and "specdec.runtime.healthcheck" in text
    assert "VOLUME" in text and "COPY" in text and ".cache" not in text  # weights never baked in
    # The image holds every installed package, and copies nothing that is not there.
    copied = re.findall(r"^COPY (\S+) \S+$", text, re.M)
    assert all((ROOT / source).exists() for source in copied), copied
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in include} <= set(copied)


def test_healthcheck_command_reports_serving_and_failure(stack):
    ok = run([sys.executable, "-m", "specdec.runtime.healthcheck", stack.target_address,
              "--service", "specdec.v1.TargetService"])
    assert ok.returncode == 0 and "SERVING" in ok.stdout
    down = run([sys.executable, "-m", "specdec.runtime.healthcheck", "127.0.0.1:9", "--timeout", "1"])
    assert down.returncode == 1
