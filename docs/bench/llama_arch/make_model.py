"""A random Llama 3-style model (llama3 rope scaling, tied embeddings, GQA) with the packaged Qwen tokenizer."""
import shutil, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out = Path("/tmp/l3/hf"); out.mkdir(parents=True, exist_ok=True)
config = LlamaConfig(vocab_size=151936, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64},
                     tie_word_embeddings=True, initializer_range=0.2, rms_norm_eps=1e-5,
                     bos_token_id=151643, eos_token_id=151645)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
model.save_pretrained(out, safe_serialization=True)
bundle = Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct/bundle"
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(bundle / name, out / name)
print(open(out / "config.json").read())
