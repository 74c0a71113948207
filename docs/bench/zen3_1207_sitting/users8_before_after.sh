# 8 users, ours before the out-of-line loops (a checkout of a31264f in $OLD) and after, in turns (run from this folder).
OLD=/tmp/kab/old
run() {  # $1: name, $2: PYTHONPATH (a checkout) or empty
  env PYTHONPATH=$2 /work/main/.venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --output users8_$1.json \
    > /tmp/users8_$1.log 2>&1
  echo "$1 $(grep -E '^(target-only|adaptive) \| 8' /tmp/users8_$1.log | awk -F'|' '{printf "%s %s ", $1, $3}')"
}
date
run before_1 $OLD; run after_1 ""; run before_2 $OLD; run after_2 ""
date
