#!/bin/bash
# One user at AVX2 (ours capped, SPECDEC_CPU_ISA=avx2) against llama-server's AVX2 build (build-avx2/ beside the
# native build: GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C and BMI2 only), as sitting_one_user.sh.
cd "$(dirname "$0")" && source ../sitting_lib.sh
ISA=avx2 with_peer one_user_avx2 1 8 ${BIN/build\/bin/build-avx2\/bin} -c 2048 -np 1
