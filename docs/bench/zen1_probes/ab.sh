#!/bin/bash
# The probe-share change (4c19e81) against the commit before it, alternating in fresh processes, native ISA:
# $1 pairs, output tag $2; extra bench flags in $EXTRA (e.g. "--max-new-tokens 256").
# "old" is a worktree of the commit before (git worktree add /tmp/exp/oldtree ec49292), imported first through
# PYTHONPATH; "new" is the editable install of the checkout. Each run's stderr keeps the per-round debug lines
# that acct.py reads.
mkdir -p /tmp/exp && cd /tmp
n=${1:-2}; tag=${2:-r}
for i in $(seq 1 $n); do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/exp/oldtree; else pp=; fi
    PYTHONPATH=$pp /work/main/.venv/bin/specdec bench --gammas "" --no-hf $EXTRA --log-level debug \
      --output /tmp/exp/ab_${tag}_${v}_$i.json > /tmp/exp/ab_${tag}_${v}_$i.log 2> /tmp/exp/ab_${tag}_${v}_$i.err
    echo "$v $i $(grep -E '^ *(target-only|adaptive) ' /tmp/exp/ab_${tag}_${v}_$i.log | awk '{print $1, $3, $5, $7, $9, $11}' | tr '\n' ' ')"
  done
done
