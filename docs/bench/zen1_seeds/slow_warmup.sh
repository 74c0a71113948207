#!/bin/bash
# A slow minute at start-up, made: `specdec bench --gammas "" --no-hf --log-level debug` with two busy loops
# beside it until its timed prompts begin (tqdm's "prompts:" on stderr), so that the warm-up's sessions teach the
# prior a slow target and the timed replies run on a quiet host. $1: "old" (PYTHONPATH=/tmp/exp/oldtree) or "new"
# (the checkout); $2: run tag. Writes /tmp/exp/slow_$1_$2.{log,err,json}.
mkdir -p /tmp/exp && cd /tmp
if [ "$1" = old ]; then pp=/tmp/exp/oldtree; else pp=; fi
out=/tmp/exp/slow_$1_$2
(while :; do :; done) & a=$!
(while :; do :; done) & b=$!
PYTHONPATH=$pp /work/main/.venv/bin/specdec bench --gammas "" --no-hf --log-level debug --output $out.json \
  > $out.log 2> $out.err &
bench=$!
until grep -q "prompts:" $out.err 2>/dev/null || ! kill -0 $bench 2>/dev/null; do sleep 0.2; done
kill $a $b
wait $bench
echo "$1 $2 $(grep -E '^ *(target-only|adaptive) ' $out.log | awk '{print $1, $3, $5}' | tr '\n' ' ')"
