"""Random weights in Llama 3.2 1B's shapes (vocabulary: the packaged Qwen tokenizer's 151,936)."""
import shutil, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out = Path("/tmp/l3/llama1b"); out.mkdir(parents=True, exist_ok=True)
config = LlamaConfig(vocab_size=151936, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192},
                     tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=151643, eos_token_id=151645)
torch.manual_seed(0)
with torch.no_grad():
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Only printable-ASCII tokens can win (the others' tied embedding rows zeroed): llama-server's output parser
    # refuses a random model's invalid UTF-8, and the timed runs must decode every token.
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct/bundle")
    keep = torch.zeros(config.vocab_size, dtype=torch.bool)
    for i in range(len(tok)):
        text = tok.decode([i])
        keep[i] = bool(text) and text.isascii() and text.isprintable()
    model.model.embed_tokens.weight[~keep] = 0
    print(int(keep.sum()), "tokens can win")
model.save_pretrained(out, safe_serialization=True)
bundle = Path.home() / ".cache/specdec/qwen2.5-coder-1.5b-instruct/bundle"
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(bundle / name, out / name)
