"""A random Qwen2-style model whose config names a rotary scaling (argv[1]: yarn or linear, factor 4, an original
context of 64 so that it moves every position), with the packaged Qwen tokenizer, in /tmp/l3/<type>."""
import shutil, sys, torch
from pathlib import Path
from transformers import Qwen2Config, Qwen2ForCausalLM
kind = sys.argv[1]
out = Path(f"/tmp/l3/{kind}"); out.mkdir(parents=True, exist_ok=True)
rope = {"rope_type": kind, "rope_theta": 1000000.0, "factor": 4.0}
if kind == "yarn":
    rope["original_max_position_embeddings"] = 64
config = Qwen2Config(vocab_size=151936, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096, rope_parameters=rope,
                     tie_word_embeddings=True, initializer_range=0.2, rms_norm_eps=1e-6,
                     bos_token_id=151643, eos_token_id=151645)
torch.manual_seed(0)
Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
bundle = Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct/bundle"
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(bundle / name, out / name)
