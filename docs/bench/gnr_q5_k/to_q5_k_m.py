"""The packaged Q4_K_M target as a Q5_K_M file would hold it: its Q4_K tensors requantized to Q5_K by the plain
quantizer of the tests (`specdec.engine.cpu.blockquant.quantize_q4_k` at 5 bits; llama.cpp's searches harder, which
changes the values, not the speed), every other tensor and the metadata copied: `python to_q5_k_m.py SRC DST`."""

import sys
from pathlib import Path

import gguf
import numpy as np

from specdec.engine.cpu.blockquant import quantize_q4_k

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gnr_q8_0_offset"))
from to_q8_0 import requantized_copy  # noqa: E402


def to_q5_k(tensor):
    if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_K:
        return None
    weights = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32)
    return quantize_q4_k(weights.reshape(-1, weights.shape[-1]), bits=5), gguf.GGMLQuantizationType.Q5_K


if __name__ == "__main__":
    requantized_copy(*sys.argv[1:3], to_q5_k)
