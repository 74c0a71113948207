#!/bin/bash
# The packaged 1.5B target as a Q3_K_M file (llama.cpp's own `llama-quantize --allow-requantize ... Q3_K_M` of the
# packaged Q4_K_M: 113 tensors Q3_K, 25 Q4_K, 3 Q5_K, the Q6_K ones kept), its config and tokenizer beside it in $Q3.
# llama-server on it, then ours before (the commit before Q3_K was read as Q6_K: a checkout of it in $OLD, its Q3_K
# tensors in float32) and after, then llama-server again.
cd "$(dirname "$0")" && source ../sitting_lib.sh
Q3=${Q3:-/tmp/q3model}; OLD=${OLD:-/tmp/wt_old}
T=$Q3/qwen2.5-coder-1.5b-instruct.Q3_K_M.gguf
MODEL=$Q3
date
llama 1
for run in "before $OLD" "after"; do set -- $run; ours_at $1 "$2"; grep -h "Q3_K\|float32" /tmp/ours_$1.log | head -3; done
llama 2
date
