# The Zen 3 sitting of 2026-12-07 (run from this folder): llama-server, ours before the out-of-line loops (a checkout
# of a31264f in $OLD) and after, in turns; both S-curves; then one user and 8 users with llama-server as the peer.
. ../sitting_lib.sh
OLD=/tmp/kab/old
MODEL=/root/.cache/specdec/qwen2.5-coder-1.5b-instruct/bundle
before_after
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --llama-bench llama_bench.json --output cpu_curve.json > /tmp/curve.log 2>&1
tail -12 /tmp/curve.log
with_peer users_1 1 8 $BIN -np 1
with_peer users_8 8 4 $BIN -np 8 -c 4096
