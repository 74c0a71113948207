"""Random models for the llama-file sittings, with the packaged Qwen tokenizer, in /tmp/l3/<kind> (seed 0):
- llama3: a Llama 3-style model, 4 layers of 512, 8 query heads over 2 key heads, tied embeddings, Llama 3 rope
  scaling with an original context of 64 (so that rope_freqs move every position), weights at 0.2;
- yarn, linear: the same sizes as a Qwen2, its config naming that rotary scaling (factor 4; YaRN's original
  context 64);
- llama1b: Llama 3.2 1B's shapes in bf16, only printable-ASCII tokens able to win (the others' tied embedding rows
  zeroed): llama-server's output parser refuses a random model's invalid UTF-8, and the timed runs must decode every
  token.
Usage: make_random_model.py KIND"""
import shutil, sys, torch
from pathlib import Path
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

BUNDLE = Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct/bundle"
SMALL = dict(vocab_size=151936, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=0.2,
             bos_token_id=151643, eos_token_id=151645)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0}


def build(kind: str):
    if kind == "llama3":
        return LlamaForCausalLM(LlamaConfig(**SMALL, rms_norm_eps=1e-5, rope_parameters={
            **LLAMA3_ROPE, "original_max_position_embeddings": 64}))
    if kind in ("yarn", "linear"):
        rope = {"rope_type": kind, "rope_theta": 1000000.0, "factor": 4.0,
                **({"original_max_position_embeddings": 64} if kind == "yarn" else {})}
        return Qwen2ForCausalLM(Qwen2Config(**SMALL, rms_norm_eps=1e-6, rope_parameters=rope))
    config = LlamaConfig(vocab_size=151936, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                         rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 8192},
                         tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=151643, eos_token_id=151645)
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(BUNDLE)
        keep = torch.zeros(config.vocab_size, dtype=torch.bool)
        for i in range(len(tokenizer)):
            text = tokenizer.decode([i])
            keep[i] = bool(text) and text.isascii() and text.isprintable()
        model.model.embed_tokens.weight[~keep] = 0
    print(int(keep.sum()), "tokens can win")
    return model


kind = sys.argv[1]
out = Path(f"/tmp/l3/{kind}")
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
build(kind).save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(BUNDLE / name, out / name)
