"""A GGUF's 2-D tensors requantized to Q8_0, as a Q8_0 file holds them (float32 tensors and metadata copied):
`python to_q8_0.py SRC.gguf DST.gguf`. Each tensor is dequantized by gguf-py, then quantized by it.
`requantized_copy` is what ../gnr_q5_k/to_q5_k_m.py uses too."""

import sys
from typing import Callable

import gguf
import numpy as np


def requantized_copy(src: str, dst: str, convert: Callable) -> None:
    """DST: SRC's metadata and tensors, each tensor as `convert(tensor)` gives it: (bytes, GGML type), or None to
    copy it as it is."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        data, kind = convert(tensor) or (np.asarray(tensor.data), tensor.tensor_type)
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=kind)
        if kind != tensor.tensor_type:
            print(tensor.name, tensor.tensor_type.name, "->", kind.name, flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def to_q8_0(tensor):
    if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
        return None
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    weights = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32)
    return gguf.quants.quantize(weights, q8_0), q8_0


if __name__ == "__main__":
    requantized_copy(*sys.argv[1:3], to_q8_0)
