#!/bin/bash
# The packaged 1.5B target as an IQ3_M file (llama.cpp's own `llama-quantize --allow-requantize ... IQ3_M 2` of the
# packaged Q4_K_M: 138 tensors IQ3_S, 59 Q4_K, 1 Q6_K), its config and tokenizer beside it in $IQ3_M: llama-server,
# ours before (IQ3_S held as float32; a checkout in $OLD), ours after (IQ3_S as Q6_K), llama-server, ours after,
# llama-server.
cd "$(dirname "$0")" && source ../sitting_lib.sh
IQ3_M=${IQ3_M:-/tmp/m_iq3_m}
T=$IQ3_M/qwen2.5-coder-1.5b-instruct.IQ3_M.gguf
MODEL=$IQ3_M
before_after
# then both S-curves on the same file (curve.log, cpu_curve.json/png)
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --target-model $MODEL --llama-bench llama_bench.json \
  --output cpu_curve.json 2>&1 | tail -7 > curve.log
