#!/bin/bash
# 2026-12-04, 05:17-05:33 UTC, Zen 3: alternating pairs of `specdec bench --concurrency 8 --repeats 2 --no-hf`,
# "old" = commit 2193e28 from a worktree at /tmp/exp/old (PYTHONPATH), "new" = the working tree with the start-up
# heap frozen. Every process's full (generation 2) collections are logged by gc_pauses_sitecustomize.py (put on
# PYTHONPATH as sitecustomize.py, in /tmp/gchook); a bench's pauses later than 25 s after its start (past the
# services' start-up and the warm-up) are printed beside its rows. Run as `ab.sh 3`, then `START=4 ab.sh 5`.
N=${1:-3}
cd /work/main
for i in $(seq ${START:-1} $N); do
  if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    rm -f /tmp/gchook/gc_*.log
    if [ $which = old ]; then pp=/tmp/exp/old:/tmp/gchook; else pp=/tmp/gchook; fi
    t0=$(date +%s.%N)
    PYTHONPATH=$pp .venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --output ab_${which}_$i.json \
      > /tmp/exp/ab_${which}_$i.log 2>&1
    pauses=$(for f in /tmp/gchook/gc_*.log; do grep gen2 $f | awk -v t0=$t0 '$1 - t0 > 25 {printf "%s ", $3}'; done)
    grep -E "^target-only|^adaptive" /tmp/exp/ab_${which}_$i.log |
      awk -v w=$which -v i=$i -v p="$pauses" '{print w, i, $0, "| gen2 after start-up:", p}'
  done
done
