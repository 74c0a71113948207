"""A GGUF file's header, read for what the loader needs: its architecture, scalars and tensors, memory-mapped.

gguf-py's `GGUFReader` builds numpy views of every element of every metadata array, the vocabulary's
151,936 tokens and 151,387 merges among them: 6.7 s a file on a Zen 4, for the scalars and the tensor table that
`specdec.engine.gguf_model` reads (the model, and the config of a file with no bundle beside it) and the
architecture that names a bare file's tokenizer (`specdec.weights.sources`). This walks the same layout (GGUF v2
and v3, little-endian; spec: ggml's docs/gguf.md) and steps over each array by its lengths. The data stay in the
file: a tensor's `data` is a read-only view of its bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The architectures the gguf loader reads (`specdec.engine.gguf_model`, which puts llama's query and key rows back
# in transformers' order); each name is transformers' model type for it.
ARCHITECTURES = ("qwen2", "qwen3", "llama")
MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# The scalar value types' struct codes, by GGUF type number (7 is bool, one byte).
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class GgufFormatError(ValueError):
    """The file is not a GGUF this reader takes (its magic, version, byte order), or it ends early."""


@dataclass(frozen=True)
class GgufTensor:
    """One tensor: `shape` innermost dimension first (GGUF's order), `tensor_type` a
    `gguf.GGMLQuantizationType`, `data` its bytes as uint8 [rows, bytes a row] (rows: the outer dimensions)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: object
    data: np.ndarray


@dataclass(frozen=True)
class GgufFile:
    """The metadata scalars and strings, the arrays' lengths (their elements skipped) and the tensors, in the
    file's order."""

    fields: dict[str, object]
    tensors: list[GgufTensor]
    array_lengths: dict[str, int]

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))


class _Cursor:
    """Little-endian reads from a buffer, each checked against its end."""

    def __init__(self, buffer: np.ndarray, path: Path):
        self.buffer, self.path, self.offset = memoryview(buffer), path, 0

    def take(self, code: str):
        size = struct.calcsize("<" + code)
        if self.offset + size > len(self.buffer):
            raise GgufFormatError(f"{self.path.name}: ends at byte {len(self.buffer)} inside its header")
        value = struct.unpack_from("<" + code, self.buffer, self.offset)[0]
        self.offset += size
        return value

    def string(self) -> str:
        length = self.take("Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise GgufFormatError(f"{self.path.name}: a string runs past the end of the file")
        text = bytes(self.buffer[self.offset:end]).decode("utf-8", errors="replace")
        self.offset = end
        return text

    def value(self, kind: int):
        """A scalar or string; an array is stepped over (its length)."""
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            return self.skip_array()
        raise GgufFormatError(f"{self.path.name}: unknown metadata value type {kind} at byte {self.offset}")

    def skip_array(self) -> int:
        """Steps over an array; returns its length."""
        kind, count = self.take("I"), self.take("Q")
        if kind in SCALARS:
            self.offset += count * struct.calcsize("<" + SCALARS[kind])
        elif kind == STRING:  # each a length and its bytes
            end, length = len(self.buffer), struct.Struct("<Q")
            for _ in range(count):
                if self.offset + 8 > end:
                    self._past_end()
                self.offset += 8 + length.unpack_from(self.buffer, self.offset)[0]
        else:
            for _ in range(count):
                self.value(kind)
        if self.offset > len(self.buffer):
            self._past_end()
        return count

    def _past_end(self) -> None:
        raise GgufFormatError(f"{self.path.name}: a metadata array runs past the end of the file")


def read_gguf(path: str | Path) -> GgufFile:
    """The header of the GGUF at `path`; raises GgufFormatError for anything else."""
    import gguf

    path = Path(path)
    buffer = np.memmap(path, dtype=np.uint8, mode="c")  # private: writable for torch's views, never written
    if bytes(buffer[:4]) != MAGIC:
        raise GgufFormatError(f"{path.name}: not a GGUF file (magic {bytes(buffer[:4])!r})")
    cursor = _Cursor(buffer, path)
    cursor.offset = 4
    version = cursor.take("I")
    if version not in VERSIONS:
        raise GgufFormatError(f"{path.name}: GGUF version {version} (big-endian, or not one of {VERSIONS})")
    n_tensors, n_fields = cursor.take("Q"), cursor.take("Q")
    fields, array_lengths = {}, {}
    for _ in range(n_fields):
        key = cursor.string()
        kind = cursor.take("I")
        (array_lengths if kind == ARRAY else fields)[key] = cursor.value(kind)
    infos = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = tuple(cursor.take("Q") for _ in range(cursor.take("I")))
        infos.append((name, dims, cursor.take("I"), cursor.take("Q")))
    alignment = int(fields.get("general.alignment") or DEFAULT_ALIGNMENT)
    start = -(-cursor.offset // alignment) * alignment
    tensors = []
    for name, dims, kind, offset in infos:
        tensor_type = gguf.GGMLQuantizationType(kind)
        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
        cols = dims[0] if dims else 1
        rows = int(np.prod(dims[1:], dtype=np.int64))  # 1 for a vector
        row_bytes = cols // block_weights * block_bytes
        begin = start + offset
        if begin + rows * row_bytes > len(buffer):
            raise GgufFormatError(f"{path.name}: tensor {name} runs past the end of the file")
        data = buffer[begin:begin + rows * row_bytes].reshape(rows, row_bytes)
        tensors.append(GgufTensor(name, dims, tensor_type, data))
    return GgufFile(fields, tensors, array_lengths)
