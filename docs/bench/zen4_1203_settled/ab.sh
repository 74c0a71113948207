#!/bin/bash
# 8 users, alternating fresh processes: old = 575de1f (a round settles at the highest α of every lookup kind it could
# find), new = 9775a60 (at the α of the lookup it finds). Worktrees: git worktree add /tmp/exp/old 575de1f, and
# /tmp/exp/new 9775a60. Each bench runs target-only and adaptive 4 times each (T A A T T A A T). $1: pairs.
out=$(dirname "$0")
for i in $(seq 1 $1); do
  for v in old new; do
    PYTHONPATH=/tmp/exp/$v /work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf \
      --output $out/ab_${v}_$i.json > /tmp/exp/ab_${v}_$i.log 2>&1
    to=$(grep -E "^target-only " /tmp/exp/ab_${v}_$i.log | awk -F'|' '{print $3}')
    ad=$(grep -E "^adaptive " /tmp/exp/ab_${v}_$i.log | awk -F'|' '{print $3, $7, $8}')
    echo "$v $i target-only $to adaptive (tok/s, mean γ, rows/pass) $ad"
  done
done
