#!/bin/bash
# Ours through the same door as llama-server: `specdec serve --http-port` (adaptive, the bench stack's settings: no
# kept caches, no lookup memory, no feed between turns) as a peer beside llama-server -np 8, 8 users, AVX-512 VNNI.
cd "$(dirname "$0")" && source ../sitting_lib.sh
date
$BIN/llama-server -m $T -t 2 --port 8091 -c 4096 -np 8 > /tmp/server_http.log 2>&1 &
/work/main/.venv/bin/specdec serve --port 0 --http-port 8000 --prefix-cache-mb 0 --lookup-memory 0 \
  --feed-between-turns off > /tmp/serve_http.log 2>&1 &
serve=$!
for i in $(seq 120); do curl -s localhost:8091/health | grep -q ok && curl -s localhost:8000/v1/models | grep -q id \
  && break; sleep 1; done
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf \
  --peers ours-http=http://127.0.0.1:8000,llama=http://127.0.0.1:8091 --output users_http.json > /tmp/peers_http.log 2>&1
tail -n 8 /tmp/peers_http.log
kill $serve; wait $serve 2>/dev/null
pkill llama-server
date
