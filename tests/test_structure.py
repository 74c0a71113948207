"""Project contracts: a pure core, and generated protobuf code that one command reproduces."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import specdec

ROOT = Path(__file__).resolve().parent.parent


def test_core_imports_no_rpc_or_infrastructure():
    modules = [f"specdec.{m.name}" for m in pkgutil.iter_modules(specdec.__path__)]
    assert "specdec.rejection" in modules and "specdec.engine" in modules
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('grpc', 'redis', 'ray')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_generated_code_is_reproducible(tmp_path):
    subprocess.run([sys.executable, "-m", "protos.generate", str(tmp_path)], check=True, cwd=ROOT)
    for name in ("specdec_pb2.py", "specdec_pb2.pyi", "specdec_pb2_grpc.py"):
        assert (tmp_path / "protos" / name).read_text() == (ROOT / "protos" / name).read_text(), \
            f"protos/{name} differs from generated code: run python -m protos.generate"


def test_the_http_api_is_a_client_of_the_contract_only():
    """http_api talks to the orchestrator through SpecDec alone: none of the orchestrator's or the
    services' modules are imported by it."""
    code = ("import sys, http_api.app, http_api.server, http_api.__main__\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in "
            "('orchestrator', 'draft_service', 'target_service', 'launch', 'cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
