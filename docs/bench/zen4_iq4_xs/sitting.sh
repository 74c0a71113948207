#!/bin/bash
# The packaged 1.5B target as an IQ4_XS file (llama.cpp's own `llama-quantize --allow-requantize ... IQ4_XS 2` of the
# packaged Q4_K_M: 166 tensors IQ4_XS, 31 Q5_K, the output layer Q6_K), its config and tokenizer beside it in $IQ4.
# llama-server on it, then ours before (a checkout of 9f2a2fa in $OLD: IQ4_XS held as float32) and after (IQ4_XS in
# its own blocks), llama-server, ours after again, llama-server again.
cd "$(dirname "$0")" && source ../sitting_lib.sh
IQ4=${IQ4:-/tmp/iq4model}; OLD=${OLD:-/tmp/wt_old}
T=$IQ4/qwen2.5-coder-1.5b-instruct.IQ4_XS.gguf
MODEL=$IQ4
before_after
