#!/bin/bash
# Run by hand after sitting.sh (2026-12-04, 00:30–00:51 UTC), in this order: 8 users again with four alternating
# repeats, then three more pairs of S-curves (llama-bench, then ours), because the first readings moved by a third.
cd "$(dirname "$0")" && source ../sitting_lib.sh
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf --output concurrency_8_r4.json
for i in 2 3 4; do
  $BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench_$i.json 2>/dev/null
  /work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --llama-bench llama_bench_$i.json --output cpu_curve_$i.json
done
# llama.cpp's own speculation with the 0.5B draft (`--spec-type draft-simple`; `-np 16`, as it asserts below that),
# between two target-only runs at the same -np.
D=/root/.cache/specdec/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf
{ serve "plain np16" 16; serve "spec np16" 16 -md $D --spec-type draft-simple; serve "plain np16 after" 16; } \
  > llama_server_speculation.txt
# 8 users twice more (00:38–00:43): once with docs/bench/zen4_1203_sitting/users8_fill/trace_logging.patch applied
# in a worktree of this commit (PYTHONPATH=<worktree>, --log-level debug; concurrency_8_r4_traced.json), once plain.
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 4 --no-hf --output concurrency_8_r4_b.json
# The AVX2 grouping A/B (00:45–00:49): base.so is this commit's avx2 q8dot build; the others are built by
# native.build('avx2', native.Q8DOT) after q8grouped.h's `enum { BY_CHUNK_ROWS = 8, BY_CHUNK_ROWS_WIDENED = 5 }`
# was set to 1, 1 (no_chunks) and to 8, 8 (widened_to_8), the file restored after each build.
# /work/main/.venv/bin/specdec bench --kernel-ab base.so,no_chunks.so --kernel-ab-repeats 48 --kernel-ab-sizes 1,2,5,9
# /work/main/.venv/bin/specdec bench --kernel-ab base.so,widened_to_8.so --kernel-ab-repeats 48 --kernel-ab-sizes 6,8
# 8 users once more (00:50), with each run's own tokens/s kept (`run_tokens_per_s`):
/work/main/.venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --output concurrency_8_runs.json
