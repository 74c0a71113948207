"""Project contracts: one installed namespace split by job, layers that import only downward, and
generated protobuf code that one command reproduces.

The layering is read from the source (every import, function-level ones included), so an import
that only some code path takes is caught as well.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("orchestrator", "draft_service", "target_service")
TOP_LEVEL = ("specdec", "protos", *SERVICES)

# What each package may import of ours (besides itself). A new edge is a design decision: add it here.
MAY_IMPORT = {
    "specdec": set(),
    "specdec.core": set(),
    "specdec.planning": {"specdec.core"},
    "specdec.engine": {"specdec.core", "specdec.planning", "specdec.weights"},
    "specdec.weights": set(),
    "specdec.runtime": {"specdec.core", "specdec.planning", "specdec.engine", "specdec.weights", "protos"},
    "draft_service": {"specdec.core", "specdec.engine", "specdec.runtime", "protos"},
    "target_service": {"specdec.core", "specdec.planning", "specdec.engine", "specdec.runtime", "protos"},
    "orchestrator": {"specdec.core", "specdec.planning", "specdec.runtime", "specdec.weights", "specdec.http",
                     "protos"},
    "specdec.http": {"specdec.core", "specdec.runtime", "specdec.weights", "protos"},
    "specdec.launch": {"specdec.runtime", "specdec.weights", "orchestrator", "protos"},
    "specdec.cli": {"specdec.launch", "specdec.runtime", "specdec.http", "specdec.tools", "orchestrator", "protos"},
    # The tooling drives the services through their public interfaces: the contract, the client, the
    # stack and the HTTP server; in process only the Hugging Face baseline and the models it times.
    "specdec.tools": {"specdec.core", "specdec.planning", "specdec.engine", "specdec.weights", "specdec.runtime",
                      "specdec.launch", "specdec.cli", "specdec.http", "orchestrator", "protos"},
    "protos": set(),
}
# Of a service package, what others may use: how to start it, configure it and call the services it calls.
PUBLIC = {"orchestrator": {"orchestrator.server", "orchestrator.servicer", "orchestrator.flags", "orchestrator.clients",
                           "orchestrator.sessions"}}
# Protocol math and planning: no OS, no threads started, no model code.
PURE = ("specdec.core", "specdec.planning")
PURE_BANNED_MODULES = {"os", "sys", "fcntl", "subprocess", "socket", "signal", "multiprocessing", "ctypes",
                       "torch.nn", "torch.distributed", "transformers", "grpc", "redis", "ray"}
PLANNING_BANNED = {"torch"}  # plain arithmetic over measured curves


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "specdec" and len(parts) > 1 else parts[0]


def source_files():
    for top in TOP_LEVEL:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "_pb2" not in path.name:
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                yield module.removesuffix(".__init__"), path


def imports_of(path: Path):
    """(module imported, line) for every absolute import in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "specdec":
            yield from ((f"specdec.{alias.name}", node.lineno) for alias in node.names)  # its subpackages
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno


def test_every_package_imports_only_the_layers_it_may():
    ours = set(MAY_IMPORT)
    wrong = []
    for module, path in source_files():
        package = package_of(module)
        assert package in MAY_IMPORT, f"{module}: a package the layering does not know; add it to MAY_IMPORT"
        for imported, line in imports_of(path):
            other = package_of(imported)
            if other in ours and other != package and other not in MAY_IMPORT[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} {package} imports {imported}")
            elif other != package and other in PUBLIC and not imported.startswith(tuple(PUBLIC[other])):
                wrong.append(f"{path.relative_to(ROOT)}:{line} {package} imports {imported}, not public")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_core_and_planning_are_pure():
    """No OS access, no threads started, no model code; planning not even torch."""
    wrong = []
    for module, path in source_files():
        package = package_of(module)
        if package not in PURE:
            continue
        banned = PURE_BANNED_MODULES | (PLANNING_BANNED if package == "specdec.planning" else set())
        for imported, line in imports_of(path):
            if any(imported == b or imported.startswith(b + ".") for b in banned):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("Thread", "Timer") or \
                    isinstance(node, ast.Name) and node.id in ("Thread", "Timer", "open"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


def loaded_by(modules: list[str], unwanted: tuple[str, ...]) -> list[str]:
    """The modules starting with any of `unwanted` that importing `modules` loads, in a fresh interpreter."""
    code = (f"import json, sys, {', '.join(modules)}\n"
            f"print(json.dumps(sorted(n for n in sys.modules if n.startswith({unwanted!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def test_importing_the_orchestrator_loads_no_model_code():
    """The orchestrator plans with arithmetic: none of the engine comes with it (its tokenizer is loaded
    through `specdec.weights`), nor either service."""
    assert loaded_by(["orchestrator.server", "orchestrator.servicer", "orchestrator.__main__"],
                     ("specdec.engine", "draft_service", "target_service")) == []


def test_the_http_api_is_a_client_of_the_contract_only():
    """The HTTP API talks to the orchestrator through SpecDec alone: none of the orchestrator's or the
    services' modules are imported by it, nor the stacks, the command or the engine."""
    assert loaded_by(["specdec.http.app", "specdec.http.server", "specdec.http.__main__"],
                     ("orchestrator", "draft_service", "target_service", "specdec.launch", "specdec.cli",
                      "specdec.engine")) == []


def test_the_command_the_launcher_and_the_clients_import_no_torch():
    """`specdec`, the stacks, the orchestrator and the HTTP API import no torch (a second of CPU): the command starts
    a stack's services first, and they import it meanwhile. Requests are checked with `specdec.core.params`; the
    draft's q goes to and from tensors in the services (`specdec.runtime.draft_probs`). (A tokenizer, once loaded,
    brings torch in through transformers' configuration code.)"""
    assert loaded_by(["specdec.cli.main", "specdec.launch.stack", "orchestrator.server", "orchestrator.__main__",
                      "specdec.http.app", "specdec.http.server"], ("torch",)) == []


def test_the_install_adds_one_namespace_and_the_services():
    """Only `specdec` and the design's service packages become import names in site-packages."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(name.rstrip("*") for name in include) == sorted(TOP_LEVEL)
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert tops == set(TOP_LEVEL), f"top-level packages {sorted(tops)}: move new ones under specdec/"


@pytest.mark.parametrize("package", sorted(p for p in MAY_IMPORT if p.startswith("specdec.")))
def test_every_package_is_a_package(package):
    assert (ROOT / package.replace(".", "/") / "__init__.py").exists()


def test_generated_code_is_reproducible(tmp_path):
    subprocess.run([sys.executable, "-m", "protos.generate", str(tmp_path)], check=True, cwd=ROOT)
    for name in ("specdec_pb2.py", "specdec_pb2.pyi", "specdec_pb2_grpc.py"):
        assert (tmp_path / "protos" / name).read_text() == (ROOT / "protos" / name).read_text(), \
            f"protos/{name} differs from generated code: run python -m protos.generate"
