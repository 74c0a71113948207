"""GPU-like passes on a CPU, to study the hosts' share of a round without a GPU.

With this folder on PYTHONPATH and SPECDEC_PAD_PASS_MS=5, every forward pass a service's batcher runs
takes at least 5 ms: the pass is computed, then padded with a sleep, which holds no GIL (as a wait for
a CUDA graph does not). The pass's reported time (`PassShape.seconds`) is its compute only. E.g.:

    PYTHONPATH=scripts/pad_passes SPECDEC_PAD_PASS_MS=5 specdec bench --draft-model tiny: \
        --target-model tiny:perturb=0.1 --concurrency 1,8 --no-hf --max-new-tokens 96

Every process that imports Python with this path set loads it, so the services started by the bench
are padded; the bench's own process has no batcher. Measurements only: nothing in specdec imports it.
"""

import os
import time

_PAD_S = float(os.environ.get("SPECDEC_PAD_PASS_MS", "0")) / 1e3

if _PAD_S > 0:
    from specdec.engine.batcher import StepBatcher

    _run = StepBatcher._run

    def _padded_run(self, batch):
        began = time.monotonic()
        _run(self, batch)
        left = _PAD_S - (time.monotonic() - began)
        if left > 0:
            time.sleep(left)

    StepBatcher._run = _padded_run
