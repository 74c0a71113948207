#!/bin/bash
# old/new controller A/B, alternating, at the ISA given in $1 (avx2 or native), $2 pairs.
# "old" is a worktree of the commit before (git worktree add /tmp/exp/oldtree 421f746), imported first through
# PYTHONPATH from a directory that is not the repository; "new" is the editable install of the checkout.
cd /tmp
isa=$1; n=${2:-2}
for i in $(seq 1 $n); do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/exp/oldtree; else pp=; fi
    if [ $isa = avx2 ]; then export SPECDEC_CPU_ISA=avx2; else unset SPECDEC_CPU_ISA; fi
    PYTHONPATH=$pp /work/main/.venv/bin/specdec bench --gammas "" --no-hf --output /tmp/exp/ab_${isa}_${v}_$i.json > /tmp/exp/ab_${isa}_${v}_$i.log 2>&1
    echo "$isa $v $i $(grep -E '^ *(target-only|adaptive) ' /tmp/exp/ab_${isa}_${v}_$i.log | awk '{print $1, $3, $5, $7, $9, $11}' | tr '\n' ' ')"
  done
done
