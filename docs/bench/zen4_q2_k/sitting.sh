#!/bin/bash
# The packaged 1.5B target as a Q2_K file (llama.cpp's own `llama-quantize --allow-requantize ... Q2_K 2` of the
# packaged Q4_K_M), its config and tokenizer beside it in $Q2. llama-server on it, then ours before (a checkout of
# e1c8589 in $OLD: Q2_K held as float32) and after (Q2_K in its own blocks), llama-server, ours after again,
# llama-server again.
cd "$(dirname "$0")" && source ../sitting_lib.sh
Q2=${Q2:-/tmp/q2model}; OLD=${OLD:-/tmp/wt_old}
T=$Q2/qwen2.5-coder-1.5b-instruct.Q2_K.gguf
MODEL=$Q2
before_after
