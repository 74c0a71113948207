"""Short full collections in a serving process: what start-up built is frozen out of the garbage collector's walks.

A process that has imported torch, transformers and grpc holds about 390,000 objects that CPython's cyclic
collector tracks, and a full (generation 2) collection walks every one of them with the GIL held. On a 2-core
Zen 3 the orchestrator's process (the embedded stack's, with the benchmark's 8 clients) spent 195-390 ms in each
full collection, one every few runs of 8 users, in which none of its sessions could reply, prepare a step or
decide a round. Its passes then held fewer rows (7.51 against 7.60-7.72 in the runs beside it), and a run of
10 s lost 2-4%: the size of adaptive's gap to batched target-only there. Objects built before serving (modules,
the model, the servers) live until the process ends, so walking them finds nothing.
"""

from __future__ import annotations

import atexit
import gc

_unfreeze_at_exit = False  # whether `gc.unfreeze` is registered to run at exit


def freeze_startup_heap() -> int:
    """Collect what start-up left unreachable, then move every surviving tracked object into the permanent
    generation (`gc.freeze`), which collections skip: a full collection afterwards walks only what the process
    allocated since. Returns the frozen count. Call once start-up is done; calling again freezes what was
    built in between (objects frozen and later dropped are still freed by their reference counts; only
    reference cycles among them outlive the process's need).

    At exit the frozen objects go back to the collector (`gc.unfreeze`, once atexit runs), so that the
    interpreter's last collections free them as before: left frozen, Triton's native module (imported through
    transformers and torch._dynamo wherever Triton is installed) found its types and functions still alive at
    finalization and printed some 80 lines of nanobind leak reports under `specdec generate`'s output."""
    global _unfreeze_at_exit
    gc.collect()
    gc.freeze()
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
    return gc.get_freeze_count()
