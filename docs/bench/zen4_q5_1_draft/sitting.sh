#!/bin/bash
# The packaged 0.5B draft as a Q5_K_M file (llama.cpp's own `llama-quantize --allow-requantize ... Q5_K_M` of the
# packaged Q4_K_M: 133 tensors Q5_1, 12 Q5_K, 12 Q6_K, 13 Q8_0), its config and tokenizer beside it in $DRAFT, beside
# the packaged target: ours before (a checkout of c0fbf84 in $OLD: Q5_1 held as float32), after with the draft's
# linears as shipped (Q5_1 in its own blocks), and after by default (`--draft-weights auto`: Q4_0).
cd "$(dirname "$0")"
DRAFT=${DRAFT:-/tmp/q5draft}; OLD=${OLD:-/tmp/wt_prev}
run() {  # $1: run name, $2: PYTHONPATH (a checkout) or empty, $3: --draft-weights
  PYTHONPATH=$2 /work/main/.venv/bin/specdec bench --paths gguf-q8 --no-hf --draft-model $DRAFT --draft-weights $3 \
    --output paths_$1.json > /tmp/ours_$1.log 2>&1
  python3 -c "import json; r=json.load(open('paths_$1.json'))['rows'][0]; print('$1', r['draft_step_ms'], r['target_only_tok_s'], r['adaptive_tok_s'], r['adaptive_alpha'], r['adaptive_identical_to_target_only'], r.get('draft_rss_mib'), r['adaptive_gammas'])"
}
date
run before $OLD auto; run as_shipped "" as-shipped; run auto "" auto
date
