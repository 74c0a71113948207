#!/bin/bash
# The Q3_K_M file capped at AVX2: 8d499fa (third bits as Q5's 64-bit words; a checkout in $PLANE) against 8f21b3e
# (bit c of each byte), alternating twice.
cd "$(dirname "$0")"
Q3=${Q3:-/tmp/q3model}; PLANE=${PLANE:-/tmp/wt_plane}
ours_at() {  # $1: run name, $2: PYTHONPATH (a checkout) or empty
  SPECDEC_CPU_ISA=avx2 PYTHONPATH=$2 /work/main/.venv/bin/specdec bench --paths gguf-q8 --no-hf --target-model $Q3 --output avx2_$1.json > /tmp/ours_avx2_$1.log 2>&1
  python3 -c "import json; r=json.load(open('avx2_$1.json'))['rows'][0]; print('ours $1', r['target_only_tok_s'], r['adaptive_tok_s'], r['adaptive_alpha'], r['adaptive_identical_to_target_only'], r['target_step_ms'], r['target_s5_over_s1'], r.get('target_rss_mib'), r['adaptive_gammas'])"
}
date
ours_at plane1 $PLANE; ours_at slice1 ""; ours_at plane2 $PLANE; ours_at slice2 ""
date
