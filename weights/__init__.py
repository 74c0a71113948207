"""Model specs to local folders: the loader concern outside the pure core.

`resolve("packaged:draft")` fetches the registry-packaged pair once (`weights.packaged`) and
returns its cached folder; any other spec (a folder, a .gguf file, `tiny:...`) passes through.
"""

from __future__ import annotations

PACKAGED_PREFIX = "packaged:"


def resolve(spec: str) -> str:
    """The spec to hand to `specdec.models`: a packaged spec becomes its local folder."""
    if not spec.startswith(PACKAGED_PREFIX):
        return spec
    from weights.packaged import ensure_packaged

    return str(ensure_packaged(spec.removeprefix(PACKAGED_PREFIX)))
