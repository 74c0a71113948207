#!/bin/bash
# The same Zen 4 capped at AVX2 (SPECDEC_CPU_ISA=avx2) against llama-server's AVX2 build (GGML_NATIVE=OFF with AVX,
# AVX2, FMA, F16C and BMI2 only, in build-avx2/ beside the native build), 8 slots, as sitting.sh's first run.
cd "$(dirname "$0")" && source ../sitting_lib.sh
ISA=avx2 with_peer users_avx2 1,4,8 4 ${BIN/build\/bin/build-avx2\/bin} -c 4096 -np 8
