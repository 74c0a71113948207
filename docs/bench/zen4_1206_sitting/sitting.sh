#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17, AVX-512 VNNI), 2026-12-06: the first sitting on this class since the
# Granite Rapids class's kernel changes (one-row pairs timed at each load, pairs of a few rows at 256 bits, Q8_0 as
# q + 128, Q5_K). The sittings' full script, then 8 users once more with four alternating repeats.
cd "$(dirname "$0")" && source ../sitting_lib.sh
full_sitting
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf --output concurrency_8_r4.json > /tmp/conc_r4.log 2>&1
tail -4 /tmp/conc_r4.log
date
