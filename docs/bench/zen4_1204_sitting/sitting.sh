#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17, AVX-512 VNNI), 2026-12-04 evening, commit ce38fdc: the first sitting on this
# class since the Zen 3's changes (b1235a4: the start-up heap frozen; 91966f5: the batcher's memory of gaps). The
# sittings' full script, then 8 users twice more with four alternating repeats each.
cd "$(dirname "$0")" && source ../sitting_lib.sh
full_sitting
for i in 2 3; do
  /work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf --output concurrency_8_r4_$i.json > /tmp/conc_$i.log 2>&1
  tail -4 /tmp/conc_$i.log
done
date
