#!/bin/bash
# old/new controller A/B on the workloads bench, alternating (old: a worktree of 421f746, as in ab.sh)
cd /tmp
for isa in native avx2; do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/exp/oldtree; else pp=; fi
    if [ $isa = avx2 ]; then export SPECDEC_CPU_ISA=avx2; else unset SPECDEC_CPU_ISA; fi
    PYTHONPATH=$pp /work/main/.venv/bin/specdec bench --workloads code,prose --no-hf --output /tmp/exp/wl_${isa}_${v}.json > /tmp/exp/wl_${isa}_${v}.log 2>&1
    echo "== $isa $v"; grep -E "^(code|prose) \|" /tmp/exp/wl_${isa}_${v}.log
  done
done
