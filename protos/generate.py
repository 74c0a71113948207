"""Regenerate the checked-in Python code for protos/specdec.proto: `python -m protos.generate`.

Output goes next to the .proto unless a folder is given (the tests regenerate into a
temporary folder and compare byte for byte).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = "protos/specdec.proto"


def generate(out_dir: Path = ROOT) -> None:
    """Writes protos/specdec_pb2.py, _pb2.pyi and _pb2_grpc.py under `out_dir`."""
    (out_dir / "protos").mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(ROOT / PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
