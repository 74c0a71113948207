#!/bin/bash
# The same Zen 4 capped at AVX2 (SPECDEC_CPU_ISA=avx2) against llama-server's AVX2 build (GGML_NATIVE=OFF with AVX,
# AVX2, FMA, F16C and BMI2 only, in build-avx2/ beside the native build), 8 slots, as sitting.sh's first run.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=${BIN/build\/bin/build-avx2\/bin}
date
$BIN/llama-server -m $T -t 2 --port 8091 -c 4096 -np 8 > /tmp/server_avx2.log 2>&1 &
for i in $(seq 60); do curl -s localhost:8091/health | grep -q ok && break; sleep 1; done
grep -o "AVX2 = 1\|AVX512 = [01]\|AVX_VNNI = [01]" /tmp/server_avx2.log | sort -u | tr '\n' ' '; echo
SPECDEC_CPU_ISA=avx2 /work/main/.venv/bin/specdec bench --concurrency 1,4,8 --repeats 4 --no-hf \
  --peers llama=http://127.0.0.1:8091 --output users_avx2.json > /tmp/peers_avx2.log 2>&1
grep "^machine" /tmp/peers_avx2.log
tail -n 12 /tmp/peers_avx2.log
pkill llama-server
date
