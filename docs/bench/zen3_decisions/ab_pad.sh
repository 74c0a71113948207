#!/bin/bash
# Alternating old (HEAD, worktree /tmp/exp/old) and new (working tree): padded 5 ms passes, 8 users, lean timing.
cd /work/main
for i in ${RUNS:-1 2 3}; do
  for which in ${ORDER:-old new}; do
    if [ $which = old ]; then pp=/tmp/exp/old:scripts/pad_passes; else pp=scripts/pad_passes; fi
    PYTHONPATH=$pp SPECDEC_PAD_PASS_MS=5 timeout 900 .venv/bin/python /tmp/u8/u8lean.py --draft-model tiny: \
      --target-model tiny:perturb=0.1 --concurrency 8 --no-hf --max-new-tokens 256 --repeats 2 \
      --output /tmp/u8/ab_${which}_$i.json > /tmp/u8/ab_${which}_$i.log 2>&1
    echo "$which $i $(grep -oE 'Generation._decide=[0-9.]+ms' /tmp/u8/ab_${which}_$i.log | tr '\n' ' ') $(grep -E '^RUN' /tmp/u8/ab_${which}_$i.log | awk '{print $2, $4, $8, $10}' | tr '\n' ' ')"
  done
done
