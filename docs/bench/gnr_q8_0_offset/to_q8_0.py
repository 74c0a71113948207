"""A GGUF's 2-D tensors requantized to Q8_0 (what a user's Q8_0 file holds); metadata copied."""
import sys, numpy as np, gguf
src, dst = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(src)
arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
w = gguf.GGUFWriter(dst, arch)
for f in r.fields.values():
    if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
        continue
    vt = f.types[0]; st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(f.name, f.contents(), vt, sub_type=st)
Q8 = gguf.GGMLQuantizationType.Q8_0
for t in r.tensors:
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
        continue
    x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
    q = gguf.quants.quantize(x, Q8)
    w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=Q8)
    print(t.name, t.tensor_type.name, x.shape, flush=True)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
