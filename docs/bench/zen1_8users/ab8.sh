#!/bin/bash
# 8 users: 5bbbda4+65feed8 ("new", the checkout) against 54ed8d6 ("old", a worktree imported first), alternating.
cd /tmp/exp/ab8
for i in $(seq 1 ${1:-2}); do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/exp/oldtree; else pp=; fi
    PYTHONPATH=$pp /work/main/.venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --output c8_${v}_$i.json > c8_${v}_$i.txt 2>&1
    echo "$v $i $(grep -E '^(target-only|adaptive) \| 8' c8_${v}_$i.txt | awk -F'|' '{print $1, $3, $7}' | tr '\n' ' ')"
  done
done
