#!/bin/bash
# One user at AVX2 (ours capped, SPECDEC_CPU_ISA=avx2) against llama-server's AVX2 build, in one process: eight
# alternating repeats of the 4 prompts (each twice), 64 tokens, greedy; the issue's "adaptive over llama-server's
# target-only" measured by `bench --concurrency 1 --peers` instead of a shell interleaving two programs.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=${BIN/build\/bin/build-avx2\/bin}
date
$BIN/llama-server -m $T -t 2 --port 8091 -c 2048 -np 1 > /tmp/server_one.log 2>&1 &
for i in $(seq 60); do curl -s localhost:8091/health | grep -q ok && break; sleep 1; done
SPECDEC_CPU_ISA=avx2 /work/main/.venv/bin/specdec bench --concurrency 1 --repeats 8 --no-hf \
  --peers llama=http://127.0.0.1:8091 --output one_user_avx2.json > /tmp/one_avx2.log 2>&1
tail -n 6 /tmp/one_avx2.log
pkill llama-server
date
