"""The packaged Q4_K_M target as a Q5_K_M file would hold it: its Q4_K tensors requantized to Q5_K by the plain
quantizer of the tests (`specdec.engine.cpu.blockquant.quantize_q4_k` at 5 bits; llama.cpp's searches harder, which
changes the values, not the speed), every other tensor and the metadata copied: `python to_q5_k_m.py SRC DST`."""

import sys

import gguf
import numpy as np

from specdec.engine.cpu.blockquant import quantize_q4_k


def main(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_K:
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
            continue
        weights = gguf.quants.dequantize(data, tensor.tensor_type).astype(np.float32)
        quantized = quantize_q4_k(weights.reshape(-1, weights.shape[-1]), bits=5)
        writer.add_tensor(tensor.name, quantized, raw_shape=quantized.shape, raw_dtype=gguf.GGMLQuantizationType.Q5_K)
        print(tensor.name, "Q4_K -> Q5_K", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
