#!/usr/bin/env bash
# Alternating A/B of two trees of specdec (OLD and NEW: folders holding the package, e.g. `git archive` outputs),
# a fresh process each run, on one venv. ARGS: the bench's; TAG and NAMES ("before after") name the outputs.
# The runs here: TAG=concurrency8 ARGS='--concurrency 8 --repeats 2 --no-hf' RUNS=3 NAMES='before after'
# (971b7c9 against the busy time); TAG=adaptive ARGS='--gammas "" --no-hf' RUNS=5 and TAG=rtt20
# ARGS='--rtt-ms 20 --gammas ""' RUNS=2, both NAMES='without_limit with_limit' (the busy time alone against it
# with the draft limit). AB_OUT: where the outputs go (this folder by default): docs/bench/zen5_prediction_ab holds
# TAG=workloads ARGS='--workloads editing,code,prose --no-hf --max-new-tokens 96' RUNS=3 NAMES='before after'
# (e49c292 against e4528ec) and TAG=editing ARGS='--workloads editing --no-hf --max-new-tokens 96' RUNS=2
# NAMES='before prediction_rule' (e49c292 against f14cafe).
set -euo pipefail
OUT=${AB_OUT:-$(cd "$(dirname "$0")" && pwd)}
read -r old_name new_name <<< "${NAMES:-old new}"
cd /tmp  # not the repo: PYTHONPATH alone chooses the tree
for i in $(seq "${RUNS:-3}"); do
  for side in old new; do
    if [ $side = old ]; then tree=$OLD name=$old_name; else tree=$NEW name=$new_name; fi
    eval PYTHONPATH="$tree" /work/main/.venv/bin/python -m specdec.cli.main bench "$ARGS" \
      --output "$OUT/${TAG}_${name}_$i.json"
  done
done
