#!/bin/bash
# Zen 1 (AMD EPYC family 23 model 1, AVX2 native, no VNNI): llama-server's native build (GGML_NATIVE=ON) and
# ours at the machine's own level, interleaved; then both S-curves.
cd "$(dirname "$0")" && source ../sitting_lib.sh
interleave
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --llama-bench llama_bench.json --output cpu_curve.json > /tmp/curve.log 2>&1
tail -20 /tmp/curve.log
date
