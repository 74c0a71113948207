#!/bin/bash
cd /work/main
for i in ${RUNS:-1 2}; do
  for which in ${ORDER:-old new}; do
    if [ $which = old ]; then pp=/tmp/exp/old; else pp=; fi
    PYTHONPATH=$pp timeout 900 .venv/bin/python /tmp/u8/u8lean.py --concurrency 8 --repeats 2 --no-hf \
      --output /tmp/u8/real_${which}_$i.json > /tmp/u8/real_${which}_$i.log 2>&1
    echo "$which $i $(grep -oE 'Generation._decide=[0-9.]+ms' /tmp/u8/real_${which}_$i.log | tr '\n' ' ') $(grep -E '^RUN' /tmp/u8/real_${which}_$i.log | awk '{print $2, $4, $8, $10}' | tr '\n' ' ')"
  done
done
