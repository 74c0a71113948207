#!/bin/bash
# old: a worktree of e3c729b^ (git worktree add /tmp/exp/trace_old e3c729b^), new: of e3c729b (/tmp/exp/trace), each
# with trace_logging.patch applied (TRACE lines: every priced choice and every gamma > 0 that choose() returned).
# ab8r.txt is the same with "for v in new old" (the order reversed). $1: pairs.
# 8 users, the drafting fill's prior: old (unmeasured = 1) against new (unmeasured = target-only's), alternating.
cd /tmp/exp
for i in $(seq 1 $1); do
  for v in old new; do
    if [ $v = old ]; then pp=/tmp/exp/trace_old; else pp=/tmp/exp/trace; fi
    PYTHONPATH=$pp /work/main/.venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --log-level debug \
      --output /tmp/exp/ab8_${v}_$i.json > /tmp/exp/ab8_${v}_$i.log 2> /tmp/exp/ab8_${v}_$i.err
    to=$(grep -E "^target-only " /tmp/exp/ab8_${v}_$i.log | awk -F'|' '{print $3}')
    ad=$(grep -E "^adaptive " /tmp/exp/ab8_${v}_$i.log | awk -F'|' '{print $3, $8, $9}')
    echo "$v $i TO $to adaptive $ad chose>0 $(grep -c 'TRACE choose' /tmp/exp/ab8_${v}_$i.err) probes $(grep -c 'TRACE probe' /tmp/exp/ab8_${v}_$i.err) drafted_rounds $(grep -c 'drafted=[1-9] by model' /tmp/exp/ab8_${v}_$i.err)"
  done
done
