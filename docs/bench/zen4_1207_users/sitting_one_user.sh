#!/bin/bash
# One user at AVX-512 VNNI against llama-server's native build, in one process: eight
# alternating repeats of the 4 prompts (each twice), 64 tokens, greedy; the issue's "adaptive over llama-server's
# target-only" measured by `bench --concurrency 1 --peers` instead of a shell interleaving two programs.
cd "$(dirname "$0")" && source ../sitting_lib.sh

date
$BIN/llama-server -m $T -t 2 --port 8091 -c 2048 -np 1 > /tmp/server_one.log 2>&1 &
for i in $(seq 60); do curl -s localhost:8091/health | grep -q ok && break; sleep 1; done
/work/main/.venv/bin/specdec bench --concurrency 1 --repeats 8 --no-hf \
  --peers llama=http://127.0.0.1:8091 --output one_user.json > /tmp/one_native.log 2>&1
tail -n 6 /tmp/one_native.log
pkill llama-server
date
