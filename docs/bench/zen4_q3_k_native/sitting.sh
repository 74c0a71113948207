#!/bin/bash
# The packaged 1.5B target as a Q3_K_M file (llama.cpp's own `llama-quantize --allow-requantize ... Q3_K_M 1` of the
# packaged Q4_K_M), its config and tokenizer beside it in $Q3. llama-server on it, then ours before (a checkout of
# 022db66 in $OLD: Q3_K carried as Q6_K blocks) and after (Q3_K in its own blocks), llama-server, ours after again,
# llama-server again.
cd "$(dirname "$0")" && source ../sitting_lib.sh
Q3=${Q3:-/tmp/q3model}; OLD=${OLD:-/tmp/wt_old}
T=$Q3/qwen2.5-coder-1.5b-instruct.Q3_K_M.gguf
MODEL=$Q3
before_after
