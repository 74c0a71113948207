#!/bin/bash
# The packaged 1.5B target as a BF16 file (llama.cpp's own `llama-quantize --allow-requantize ... BF16 2` of the
# packaged Q4_K_M), its config and tokenizer beside it in $BF16: llama-server, ours, llama-server, ours, llama-server.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BF16=${BF16:-/tmp/m_bf16}
T=$BF16/qwen2.5-coder-1.5b-instruct.BF16.gguf
MODEL=$BF16
date
llama 1; ours_at 1 ""; llama 2; ours_at 2 ""; llama 3
date
