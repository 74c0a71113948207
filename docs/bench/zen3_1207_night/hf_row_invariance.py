"""Whether Hugging Face's forward gives a token the same bits in a one-token step as inside a k-token pass (what
assisted generation's verify does), on our gguf-q8 linears: the first module whose output differs, and the
attention output's (o_proj's input) difference. Argument: the attention implementation (sdpa, the default, or
eager)."""
import sys
import torch
from transformers import DynamicCache
from specdec import weights
from specdec.tools.bench.baseline import hf_baseline
from specdec.weights.sources import load_tokenizer

model = hf_baseline("packaged:target", torch.device("cpu"), "gguf-q8", "")
if len(sys.argv) > 1:
    model.config._attn_implementation = sys.argv[1]
tokens = load_tokenizer(weights.resolve("packaged:target"))("def fibonacci(n):\n    if n < 2:\n        return n\n",
                                                            return_tensors="pt").input_ids
k = 5
prefix, tail = tokens[:, :-k], tokens[:, -k:]
names = {m: n for n, m in model.named_modules()}


def run(chunks):
    """Each module's 3-d output over the tail's tokens, o_proj's input in layer 0, and the logits."""
    outs, attention = {}, []

    def keep(module, inputs, out):
        o = out[0] if isinstance(out, tuple) else out
        if torch.is_tensor(o) and o.dim() == 3:
            outs.setdefault(names[module], []).append(o.clone())
    hooks = [m.register_forward_hook(keep) for m in model.modules() if m is not model]
    hooks.append(model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(
        lambda m, inputs: attention.append(inputs[0].clone())))
    cache = DynamicCache()
    with torch.inference_mode():
        model(prefix, past_key_values=cache, use_cache=True)
        outs.clear(), attention.clear()
        logits = torch.cat([model(c, past_key_values=cache, use_cache=True).logits for c in chunks], dim=1)
    for h in hooks:
        h.remove()
    return {n: torch.cat(v, dim=1) for n, v in outs.items()}, torch.cat(attention, dim=1), logits


step, step_attention, step_logits = run([tail[:, i:i + 1] for i in range(k)])
verify, verify_attention, verify_logits = run([tail])
print(f"attention {model.config._attn_implementation}; logits equal: {torch.equal(step_logits, verify_logits)} "
      f"(max difference {(step_logits - verify_logits).abs().max().item():.3g})")
for name in step:
    if step[name].shape == verify[name].shape and not torch.equal(step[name], verify[name]):
        print(f"first module to differ: {name}")
        break
for name in ("model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj",
             "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn"):
    print(f"  {name:36} equal {torch.equal(step[name], verify[name])}")
d = (step_attention - verify_attention).abs()
print(f"layer 0's attention output (o_proj's input): max |a| {step_attention.abs().max().item():.3g}, max difference "
      f"{d.max().item():.3g}, {(d > 0).sum().item()} of {d.numel()} elements differ")
