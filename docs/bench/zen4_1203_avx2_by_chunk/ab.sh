#!/bin/bash
# AVX2-capped A/B of q8dot.c: old (7dd309f) and new (484cd55), alternating, `bench --paths gguf-q8 --no-hf`.
# Run 3 (after e19c104: chunks from 128 KiB) was the same loop once, with new_q8dot.c from e19c104.
# It ran with the files in /tmp/ab: old_q8dot.c from `git show 7dd309f:specdec/engine/cpu/csrc/q8dot.c`, new_q8dot.c the commit's.
cd /work/main
for i in 1 2; do
  for v in old new; do
    cp /tmp/ab/${v}_q8dot.c specdec/engine/cpu/csrc/q8dot.c
    SPECDEC_CPU_ISA=avx2 .venv/bin/specdec bench --paths gguf-q8 --no-hf --output /tmp/ab/paths_avx2_${v}_$i.json > /tmp/ab/log_${v}_$i.txt 2>&1
    python3 -c "import json; r=json.load(open('/tmp/ab/paths_avx2_${v}_$i.json'))['rows'][0]; print('$v $i', r['target_only_tok_s'], r['adaptive_tok_s'], r['adaptive_alpha'], r['adaptive_identical_to_target_only'], r['target_step_ms'], r['target_s5_over_s1'], r['draft_step_ms'], r['agreement_with_fp32'], r['adaptive_gammas'])"
  done
done
cp /tmp/ab/new_q8dot.c specdec/engine/cpu/csrc/q8dot.c
