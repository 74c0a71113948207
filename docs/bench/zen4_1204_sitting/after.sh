#!/bin/bash
# Run by hand after sitting.sh (2026-12-04, 22:02–22:10 UTC), with a print added for the run to
# GammaController.choose at every γ > 0 and every probe (not committed): 8 users, 6 then 12 alternating repeats.
# The one line it printed, a probe of γ = 1 in the second run, is concurrency_8_r12_after_trace.txt.
cd "$(dirname "$0")"
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 6 --no-hf --output concurrency_8_r6_after.json
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 12 --no-hf --output concurrency_8_r12_after.json
