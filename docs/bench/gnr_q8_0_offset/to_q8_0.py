"""A GGUF's 2-D tensors requantized to Q8_0, as a Q8_0 file holds them (float32 tensors and metadata copied):
`python to_q8_0.py SRC.gguf DST.gguf`. Each tensor is dequantized by gguf-py, then quantized by it."""

import sys

import gguf
import numpy as np


def main(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
            continue
        quantized = gguf.quants.quantize(gguf.quants.dequantize(data, tensor.tensor_type).astype(np.float32), q8_0)
        writer.add_tensor(tensor.name, quantized, raw_shape=quantized.shape, raw_dtype=q8_0)
        print(tensor.name, tensor.tensor_type.name, "-> Q8_0", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
