#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17, AVX-512 VNNI), 2026-12-03: the same class the day after, on a faster host
# hour. llama-server's native build and ours interleaved; then both S-curves and 8 users.
cd "$(dirname "$0")" && source ../sitting_lib.sh
interleave
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --llama-bench llama_bench.json --output cpu_curve.json > /tmp/curve.log 2>&1
tail -12 /tmp/curve.log
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --output concurrency_8.json > /tmp/conc.log 2>&1
tail -12 /tmp/conc.log
date
