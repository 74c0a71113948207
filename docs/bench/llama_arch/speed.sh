#!/bin/bash
# Speed on a llama file: random weights in Llama 3.2 1B's shapes (make_random_model.py llama1b: 16 layers of 2048, 32
# query heads over 8 key heads, MLP 8192, tied embeddings, Llama 3 rope_freqs; the packaged Qwen tokenizer, only
# printable-ASCII tokens able to win), f16 by the sdist's converter, then `llama-quantize ... Q4_K_M`.
# llama-server and ours alternate on the bench prompts, 64 tokens each (sitting_lib.sh); the draft is the packaged
# 0.5B (random target: nothing to accept, so adaptive is target-only's).
cd "$(dirname "$0")"
source ../sitting_lib.sh
T=/tmp/l3/llama1b-Q4_K_M.gguf
MODEL=$T
if [ ! -f $T ]; then  # made once: about 5 minutes on 2 cores (sentencepiece for the converter in /tmp/spm)
  /work/main/.venv/bin/python make_random_model.py llama1b
  (cd $BIN/../.. && PYTHONPATH=gguf-py:/tmp/spm /work/main/.venv/bin/python convert_hf_to_gguf.py /tmp/l3/llama1b \
     --outtype f16 --outfile /tmp/l3/llama1b-f16.gguf)
  $BIN/llama-quantize /tmp/l3/llama1b-f16.gguf $T Q4_K_M 2
fi
date
llama 1; ours_at 1 ""; llama 2; ours_at 2 ""; llama 3
$BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
/work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --target-model $T --llama-bench llama_bench.json \
  --output cpu_curve.json > /tmp/curve.log 2>&1
tail -12 /tmp/curve.log
date
