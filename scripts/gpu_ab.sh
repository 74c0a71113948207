#!/usr/bin/env bash
# Two builds side by side on a lent GPU, in little device time: `specdec bench --gpu --gpu-services` (one user
# and 8 through the services, on the synthetic pair) alternating between this tree and OLD, RUNS pairs (2),
# this tree first. OLD is a folder holding the other build's files, carried as an untracked folder of this tree:
#   mkdir ab_old && git archive REV | tar -x -C ab_old      (REV must have --gpu-services: 4b80b31 or later)
# or, for two settings of this tree, OLD is "." and OLD_ENV the old side's environment, e.g.
#   OLD_ENV="SPECDEC_STATIC_ATTENTION=sdpa" bash scripts/gpu_ab.sh .
# With TESTS set, this tree's CUDA tests matching it (pytest -k) run first. Carry .whl/ (scripts/gpu_wheels.sh).
# Outputs in /tmp/gpu_ab: {new,old}_N.json and .txt, cuda_tests.txt; where $OUT is set (the device tool's), packed
# after each run into $OUT/gpu_ab.tgz (a call brings back eight files, and RUNS=2 with TESTS writes nine).
# About a minute a run on an H200 (the services' compiled start included): give 4 runs and the tests 6 minutes.
set -u
old=$(cd "${1:?usage: scripts/gpu_ab.sh OLD_TREE}" && pwd)
new=$PWD
out=/tmp/gpu_ab
mkdir -p "$out"
pack() { if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu_ab.tgz" -C "$out" .; fi; }
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
fi
export SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec-cache} PYTHONUNBUFFERED=1
if [ -n "${TESTS:-}" ]; then
    PYTHONPATH=/tmp/site:$new timeout 150 python3 -m pytest -o addopts="" -p no:cacheprovider -m cuda \
        tests/test_cuda.py -q -rA -k "$TESTS" > "$out/cuda_tests.txt" 2>&1
    grep -E "PASSED|FAILED|ERROR|passed|failed" "$out/cuda_tests.txt" | tail -8
    pack
fi
for i in $(seq "${RUNS:-2}"); do
    for side in new old; do
        tree=$new settings=
        [ "$side" = old ] && tree=$old settings=${OLD_ENV:-}
        (cd "$tree" && env $settings PYTHONPATH=/tmp/site:$tree timeout "${RUN_SECONDS:-100}" python3 -m specdec.cli.main bench \
            --gpu --gpu-services --gammas "" --max-new-tokens 128 --output "$out/${side}_$i.json" \
            > "$out/${side}_$i.txt" 2>&1)
        grep -E "^target-only|^ *adaptive|^ *hybrid|^8 users" "$out/${side}_$i.txt" | sed "s/^/$side $i: /"
        pack
    done
done
