"""The start-up cost profile, kept on disk so that a one-shot command does not re-time the machine.

A profile is a property of (model weights, compute path and kernel, CPU or GPU and its forced
level, torch version, threads, tensor-parallel size, profiled sizes). Its key covers all of them:
a change to any re-measures. Entries also expire after `max_age_s`, so slow changes the key cannot
see (firmware, a busier host) are re-measured now and then. Online, the γ controller learns a
drift scale on top of whatever the profile says.

A kernel setting timed at a model's load (gguf-q8's one-row pairs) is kept the same way (`setting_or_time`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specdec.engine.cpu import native
from specdec.engine.cpu.others_load import OthersLoad
from specdec.planning.cost import PROFILE_CONTEXT, CostProfile

log = logging.getLogger(__name__)

# 2: each size capped by the larger ones' (`measure.monotone`); 3: timed off the initial thread, as served; 4: the
# shared-pass sizes best of every repeat too; 5: attention at depth (`per_position_s`). Older entries are measured
# again.
FORMAT = 5
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".json")
# A profile measured while other processes took more than this share of the machine's CPU time is kept only
# BUSY_MAX_AGE_S: the README's first command, run beside a compile on 2 cores, priced the target's step at 65.9 ms
# where it takes 31-39, and would have kept that for a week.
BUSY_SHARE, BUSY_MAX_AGE_S = 0.25, 600.0


def weights_fingerprint(spec: str) -> list:
    """What identifies a model's weights: its spec, plus each weight file's name, size and mtime."""
    path = Path(spec)
    if not path.exists():
        return [spec]  # tiny:... specs are their own definition
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    return [str(path.resolve())] + [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def profile_key(spec: str, path: str, kernel: str, device: str, sizes: list[int], world: int = 1,
                scored_tokens: int | None = None) -> dict:
    """Everything a measured profile depends on; the gguf path adds its C kernel's build (source and flags).
    scored_tokens: how many ids a cut output layer scores (`ModelRunner.limit_vocabulary`; None: all)."""
    return {"format": FORMAT, "weights": weights_fingerprint(spec), "path": path, "kernel": kernel, "device": device,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "world": world, "sizes": sizes,
            "context": PROFILE_CONTEXT, "kernel_build": _kernel_build(path), "scored_tokens": scored_tokens}


def setting_key(name: str, spec: str, choice) -> dict:
    """What a kernel setting timed on a model (`setting_or_time`) depends on: the profile's key without sizes,
    for `choice` (a `PathChoice`) as built before the setting."""
    return {**profile_key(spec, choice.path, choice.kernel, choice.device, []), "setting": name}


def _kernel_build(path: str) -> str:
    """The C kernel build a packed path's timings depend on (its source, headers and flags); "" for others."""
    sources = {"gguf": native.BLOCKQUANT, "gguf-q8": native.Q8DOT}
    return native.build_digest(sources[path]) if path in sources else ""


@dataclass(frozen=True)
class ProfileCache:
    folder: Path
    max_age_s: float = 7 * 24 * 3600

    def _file(self, key: dict) -> Path:
        """A profile's file in `folder`, a kernel setting's in its `settings/` (`setting_key`)."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        return (self.folder / "settings" if "setting" in key else self.folder) / f"{digest}.json"

    def load(self, key: dict) -> CostProfile | None:
        """The stored profile for `key`, or None (absent, expired, unreadable or for another key). An entry
        measured on a busy machine expires after BUSY_MAX_AGE_S."""
        entry = self._entry(key)
        try:
            return CostProfile(tuple(entry["seconds"]), tuple(entry["tokens"]), float(entry["per_position_s"]))
        except (KeyError, TypeError, ValueError):
            return None

    def store(self, key: dict, profile: CostProfile, others_share: float | None = None) -> None:
        """Write atomically (a temp file renamed), so concurrent services never read half an entry.
        `others_share`: what other processes took of the machine while it was measured (`OthersLoad`)."""
        self._store(key, {"seconds": list(profile.seconds), "tokens": list(profile.tokens),
                          "per_position_s": profile.per_position_s}, others_share)

    def load_setting(self, key: dict) -> bool | None:
        """A kernel setting timed on this machine before (`setting_or_time`), as `load` keeps profiles."""
        value = self._entry(key).get("setting")
        return value if isinstance(value, bool) else None

    def store_setting(self, key: dict, value: bool, others_share: float | None = None) -> None:
        self._store(key, {"setting": value}, others_share)

    def _entry(self, key: dict) -> dict:
        """The stored entry for `key`, or {} (absent, expired, unreadable or for another key)."""
        try:
            entry = json.loads(self._file(key).read_text())
            max_age_s = BUSY_MAX_AGE_S if (entry.get("others_share") or 0.0) > BUSY_SHARE else self.max_age_s
            if entry["key"] != key or time.time() - entry["measured_at"] > max_age_s:
                return {}
            return entry
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _store(self, key: dict, fields: dict, others_share: float | None) -> None:
        entry = {"key": key, "measured_at": time.time(), **fields, "others_share": others_share}
        try:
            file = self._file(key)
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(entry, handle)
            os.replace(tmp, file)
        except OSError as exc:
            log.warning("could not cache %s in %s: %s", "a kernel setting" if "setting" in fields else
                        "the cost profile", self.folder, exc)


def load_or_measure(cache: ProfileCache | None, key: Callable[[], dict],
                    measure: Callable[[], CostProfile]) -> CostProfile:
    """The cached profile for `key()`, or `measure()` (stored for the next start; for BUSY_MAX_AGE_S only where
    other processes took more than BUSY_SHARE of the machine meanwhile). No cache: measure."""
    if cache is None:
        return measure()
    entry = key()
    profile = cache.load(entry)
    if profile is None:
        profile, share = _measured(measure, cache, "the cost profile")
        cache.store(entry, profile, share)
    else:
        log.info("cost profile from %s: forward of %s tokens = %s ms; attention at depth %.0f ns a token and "
                 "position", cache.folder, ",".join(map(str, profile.tokens)),
                 " ".join(f"{s * 1e3:.0f}" for s in profile.seconds), profile.per_position_s * 1e9)
    return profile


def setting_or_time(cache: ProfileCache | None, key: Callable[[], dict], time_it: Callable[[], bool],
                    apply: Callable[[bool], bool], what: str) -> bool:
    """A kernel setting as `load_or_measure` keeps profiles: the cached one for `key()`, taken with `apply` (which
    returns the setting as it took effect), or `time_it()` (which takes what it decides), stored for the next
    start. No cache: timed. Returns the setting in effect."""
    if cache is None:
        return time_it()
    entry = key()
    setting = cache.load_setting(entry)
    if setting is None:
        setting, share = _measured(time_it, cache, what)
        cache.store_setting(entry, setting, share)
    else:
        setting = apply(setting)
        log.info("%s from %s: %s", what, cache.folder, setting)
    return setting


def _measured(measure: Callable, cache: ProfileCache, what: str) -> tuple:
    """`measure()` and the share of the machine's CPU time other processes took meanwhile (warned of above
    BUSY_SHARE: the result is then kept BUSY_MAX_AGE_S)."""
    with OthersLoad() as load:
        result = measure()
    if load.share is not None and load.share > BUSY_SHARE:
        log.warning("other processes took %.0f%% of this machine's CPU time while %s was measured: it is kept %.0f "
                    "minutes, not %.0f days", 100 * load.share, what, BUSY_MAX_AGE_S / 60, cache.max_age_s / 86400)
    return result, load.share
