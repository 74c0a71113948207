#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17, AVX-512 VNNI), 2026-12-07: many users against llama-server's own batching.
# Run 1 (users_np8_run1.*): llama-server with 8 slots (-np 8: one batch a step for all of them) on the same GGUF,
# driven through its OpenAI API by `bench --concurrency --peers`, in the same alternation as our target-only and
# adaptive configs. Run 2 (users_peers.*): that server and a second one drafting with the 0.5B (draft-simple, up to
# 4 tokens; it asserts in its draft context with 8 users unless it has many more slots than users: -np 48 here).
cd "$(dirname "$0")" && source ../sitting_lib.sh
D=/root/.cache/specdec/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf
start() {  # $1: port, the rest: llama-server's flags beyond the model and threads
  port=$1; shift
  $BIN/llama-server -m $T -t 2 --port $port "$@" > /tmp/server_$port.log 2>&1 &
  healthy $port
}
date
start 8091 -c 4096 -np 8
start 8092 -c 24576 -np 48 --spec-type draft-simple -md $D --spec-draft-n-max 4 --spec-draft-n-min 0
/work/main/.venv/bin/specdec bench --concurrency 1,4,8 --repeats 4 --no-hf \
  --peers llama=http://127.0.0.1:8091,llama-spec=http://127.0.0.1:8092 --output users_peers.json > /tmp/peers.log 2>&1
tail -n 14 /tmp/peers.log
grep -h "draft acceptance" /tmp/server_8092.log | tail -n 4
pkill llama-server
date
