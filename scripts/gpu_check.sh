#!/usr/bin/env bash
# Issue 30's GPU checks in one prepared run, for a lent GPU host that downloads nothing (../shared/GPU.md):
#   1. the CUDA tests (tests/test_cuda.py): the static runner's graphs and its batch invariance bit for bit,
#      its layers eager and compiled, its attention the Triton kernel or the memory-efficient one; greedy
#      speculation identical to target-only through the services, whose runners compile their layers (the
#      default on CUDA); then the Triton kernel's own tests (tests/test_pool_attention.py) on the GPU;
#   2. the kernels of one target step, compiled, with each attention, by device time (scripts/gpu_kernels.py);
#      the pool kernel alone at depths to 8,192, its walk split in parts and whole (scripts/gpu_pool_depth.py);
#      the target's replayed step and a 256-token chunk after 0-3,840 tokens of context (`specdec bench --depths`);
#   3. the GPU benchmark (`specdec bench --gpu`, README): step curves eager and compiled against the bandwidth
#      floor, then the services against Hugging Face eager and compiled, 1 and 8 users; with STEPS_ONLY=1 only
#      the step curves (`--gpu-steps`);
#   4. where a target-only round goes (`specdec profile`): the target's step, the gRPC hop in its two directions
#      and the orchestrator, from the spans (skipped with STEPS_ONLY=1);
#   5. where the target service's host time goes at 8 users (scripts/host_profile.py: py-spy, the GIL's holder),
#      when py-spy is there (skipped with STEPS_ONLY=1).
# Carry .whl/ (scripts/gpu_wheels.sh fills it) and run from the repository root: bash scripts/gpu_check.sh
# KERNELS=0 skips part 2's kernel listing and HOST_PROFILE=0 part 5, about two minutes together.
# Results go to /tmp/gpu_check; where $OUT is set (the device tool's), packed after each part into
# $OUT/gpu_check.tgz (the parts write more files than a device call brings back). The parts' timeouts add up to
# 12.75 minutes, 10.6 with KERNELS=0 HOST_PROFILE=0: give the command 600 s. About 8.5 minutes on an H200 (6.9 on
# 2026-11-29, before part 5 and the depths; 6.3 with KERNELS=0 HOST_PROFILE=0 on 2026-12-04), with a 30 s start;
# 2.5 with STEPS_ONLY=1, after the tests.
# The benchmark writes each of its parts as it ends, so a cut run keeps what it measured.
set -u
out=/tmp/gpu_check
quiet() { grep -v "it/s\]" | grep -v "^DEBUG"; }  # without progress bars and torch's debug lines
pack() { if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu_check.tgz" -C "$out" .; fi; }
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec-cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"
timeout 125 python3 -m pytest -o addopts="" -p no:cacheprovider -m cuda \
    tests/test_cuda.py -q -rA --durations=5 > "$out/cuda_tests.txt" 2>&1
tail -25 "$out/cuda_tests.txt"
pack
timeout 60 python3 -m pytest -o addopts="" -p no:cacheprovider tests/test_pool_attention.py -q -rA \
    > "$out/pool_attention_tests.txt" 2>&1
tail -3 "$out/pool_attention_tests.txt"
pack
if [ "${KERNELS:-1}" != 0 ]; then
    timeout 50 python3 scripts/gpu_kernels.py synthetic:target > "$out/kernels.txt" 2>&1
    grep "kernels a step" "$out/kernels.txt"
    pack
fi
timeout 40 python3 scripts/gpu_pool_depth.py "$out/pool_depth.json" > "$out/pool_depth.txt" 2>&1
tail -20 "$out/pool_depth.txt"
pack
timeout 60 python3 -m specdec.cli.main bench --depths 0,1024,2048,3840 --device cuda --target-model synthetic:target \
    --output "$out/depth.json" > "$out/depth.txt" 2>&1
quiet < "$out/depth.txt" | tail -6
pack
if [ "${STEPS_ONLY:-0}" = 1 ]; then
    timeout 120 python3 -m specdec.cli.main bench --gpu --gpu-steps --output "$out/gpu_steps.json" \
        > "$out/gpu_bench.txt" 2>&1
else
    timeout "${BENCH_SECONDS:-275}" python3 -m specdec.cli.main bench --gpu --max-new-tokens 128 --gammas 2,4 \
        --output "$out/gpu_bench.json" > "$out/gpu_bench.txt" 2>&1
fi
quiet < "$out/gpu_bench.txt" | tail -40
pack
if [ "${STEPS_ONLY:-0}" != 1 ]; then
    timeout 75 python3 -m specdec.cli.main profile --device cuda --draft-model synthetic:draft \
        --target-model synthetic:target --gamma 0 --max-new-tokens 128 --limit-prompts 3 \
        --trace-file /tmp/gpu_profile.spans.jsonl --output "$out/profile.json" 2>&1 | quiet | tail -16
    pack
fi
if [ "${STEPS_ONLY:-0}" != 1 ] && [ "${HOST_PROFILE:-1}" != 0 ] && { command -v py-spy > /dev/null || [ -x /tmp/site/bin/py-spy ]; }; then
    timeout 80 python3 scripts/host_profile.py --device cuda --seconds 15 > "$out/host_profile.txt" \
        2> "$out/host_profile_stderr.txt"
    head -30 "$out/host_profile.txt"
    pack
fi
