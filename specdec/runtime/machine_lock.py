"""One process on this machine at a time: services that share it load and profile in turn."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def machine_lock(name: str = "specdec-startup.lock"):
    """Held by one process on this machine at a time (a file lock in the temp folder).

    Services that share a machine load and profile one after the other: a profile measured while
    another process loads a model would time that process as much as this one.
    """
    path = Path(os.environ.get("SPECDEC_LOCK_DIR", tempfile.gettempdir())) / name
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
