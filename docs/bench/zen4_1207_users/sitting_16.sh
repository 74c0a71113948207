#!/bin/bash
# 16 users at once against llama-server with 16 slots (-np 16 -c 8192: 512 positions each), AVX-512 VNNI, two
# alternating repeats; the same 4 prompts, each taken by four users.
cd "$(dirname "$0")" && source ../sitting_lib.sh
date
$BIN/llama-server -m $T -t 2 --port 8091 -c 8192 -np 16 > /tmp/server_16.log 2>&1 &
for i in $(seq 60); do curl -s localhost:8091/health | grep -q ok && break; sleep 1; done
/work/main/.venv/bin/specdec bench --concurrency 16 --repeats 2 --no-hf \
  --peers llama=http://127.0.0.1:8091 --output users_16.json > /tmp/peers_16.log 2>&1
tail -n 5 /tmp/peers_16.log
pkill llama-server
date
