#!/bin/bash
# The packaged 1.5B target as an F16 file (llama.cpp's own `llama-quantize --allow-requantize ... F16 2` of the
# packaged Q4_K_M: its values, in the format of the official repository's fp16 file), its config and tokenizer
# beside it in $F16. llama-server on it, then ours before (a checkout of 03042cf in $OLD: F16 held as float32) and
# after (F16 in its own blocks), llama-server, ours after again, llama-server again; then both S-curves.
cd "$(dirname "$0")" && source ../sitting_lib.sh
F16=${F16:-/tmp/m_f16}; OLD=${OLD:-/tmp/wt_old}
T=$F16/qwen2.5-coder-1.5b-instruct.F16.gguf
MODEL=$F16
before_after
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --target-model $MODEL --llama-bench llama_bench.json \
  --output cpu_curve.json > /tmp/curve.log 2>&1
tail -12 /tmp/curve.log
date
