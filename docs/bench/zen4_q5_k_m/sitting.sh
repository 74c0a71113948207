#!/bin/bash
# The packaged 1.5B target as a Q5_K_M file (llama.cpp's own `llama-quantize --allow-requantize ... Q5_K_M` of the
# packaged Q4_K_M: 169 tensors Q5_K, 16 more Q6_K), its config and tokenizer beside it in $Q5: our runs between
# llama-server's on the same file (Q5_K on the integer kernel since 4f7530a; not compared with llama-server then).
cd "$(dirname "$0")" && source ../sitting_lib.sh
Q5=${Q5:-/tmp/q5model}
T=$Q5/qwen2.5-coder-1.5b-instruct.Q5_K_M.gguf
OURS_ARGS="--target-model $Q5"
date
llama 1; ours 1; llama 2; ours 2; llama 3
date
