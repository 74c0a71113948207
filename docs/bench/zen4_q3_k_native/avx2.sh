#!/bin/bash
# The same Q3_K_M file capped at AVX2 (SPECDEC_CPU_ISA=avx2): ours before (022db66 in $OLD) and after, twice, alternating.
cd "$(dirname "$0")"
Q3=${Q3:-/tmp/q3model}; OLD=${OLD:-/tmp/wt_old}
ours_at() {  # $1: run name, $2: PYTHONPATH (a checkout) or empty
  SPECDEC_CPU_ISA=avx2 PYTHONPATH=$2 /work/main/.venv/bin/specdec bench --paths gguf-q8 --no-hf --target-model $Q3 --output avx2_$1.json > /tmp/ours_avx2_$1.log 2>&1
  python3 -c "import json; r=json.load(open('avx2_$1.json'))['rows'][0]; print('ours $1', r['target_only_tok_s'], r['adaptive_tok_s'], r['adaptive_alpha'], r['adaptive_identical_to_target_only'], r['target_step_ms'], r['target_s5_over_s1'], r.get('target_rss_mib'), r['agreement_with_fp32'], r['adaptive_gammas'])"
}
date
ours_at before1 $OLD; ours_at after1 ""; ours_at before2 $OLD; ours_at after2 ""
date
