#!/usr/bin/env bash
# Issue 30's GPU checks in one prepared run, for a lent GPU host that downloads nothing (../shared/GPU.md):
#   1. the CUDA tests (tests/test_cuda.py): the static runner's graphs and its batch invariance bit for bit,
#      its piece eager and compiled; greedy speculation identical to target-only through the services;
#   2. the step curves of both synthetic models, the static runner eager and compiled beside each other,
#      against the bandwidth floor (`specdec bench --gpu --gpu-steps`).
# Carry .whl/ (scripts/gpu_wheels.sh fills it) and run from the repository root: bash scripts/gpu_check.sh
# Results go to $OUT (the device tool's) or /tmp/gpu_check. About 8 minutes on an H100; each part has a timeout.
set -u
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"
timeout 270 python3 -m pytest -o addopts="" -p no:cacheprovider -m cuda tests/test_cuda.py -q -rA 2>&1 \
    | tail -30 | tee "$out/cuda_tests.txt"
timeout 270 python3 -m specdec.cli.main bench --gpu --gpu-steps --output "$out/gpu_steps.json" 2>&1 \
    | grep -v "it/s\]" | tail -30 | tee "$out/gpu_steps.txt"
