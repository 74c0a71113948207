"""The GGUF header reader (`specdec.weights.gguf_file`) against gguf-py's own reader, on files gguf-py writes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from specdec.weights.gguf_file import GgufFormatError, read_gguf
from specdec.engine.gguf_model import UnsupportedGguf, load_gguf_model

TOKENS = ["", "a", "Ġthe", "é", "日本語", "\n\n", *(f"tok{i}" for i in range(3000))]  # empty, multi-byte


def write_file(path, alignment: int | None = None) -> None:
    """Metadata of every kind (arrays of strings, numbers and booleans among scalars) and tensors of several
    formats and ranks."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "qwen2")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_block_count(3)
    writer.add_string("test.text", "header ✓")
    writer.add_bool("test.flag", True)
    writer.add_uint64("test.big", 2 ** 40 + 3)
    writer.add_int32("test.negative", -7)
    writer.add_float32("test.float", 0.25)
    writer.add_array("tokenizer.ggml.tokens", TOKENS)
    writer.add_array("test.scores", [float(i) / 3 for i in range(500)])
    writer.add_array("test.flags", [True, False, True])
    writer.add_string("test.after_arrays", "still read")
    writer.add_tensor("norm.weight", rng.standard_normal(96).astype(np.float32))
    writer.add_tensor("cube.weight", rng.standard_normal((2, 3, 64)).astype(np.float32))
    writer.add_tensor("half.weight", rng.standard_normal((5, 64)).astype(np.float16))
    for qtype, rows, cols in ((gguf.GGMLQuantizationType.Q8_0, 7, 96), (gguf.GGMLQuantizationType.Q4_K, 3, 512)):
        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows, cols // block_weights * block_bytes), dtype=np.uint8)
        writer.add_tensor(f"{qtype.name}.weight", raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 4096])
def test_the_header_reads_as_gguf_py_reads_it(tmp_path, alignment):
    """Every scalar and string field, each array's length, the tensors' names, shapes and formats, and each
    tensor's bytes, as gguf-py's reader has them; arrays are stepped over, strings of several bytes a character
    included."""
    path = tmp_path / "t.gguf"
    write_file(path, alignment)
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert ours.architecture == "qwen2"
    fields = {key: field for key, field in theirs.fields.items() if not key.startswith("GGUF.")}  # theirs: + 3
    assert set(ours.fields) | set(ours.array_lengths) == set(fields) and not set(ours.fields) & set(ours.array_lengths)
    for key, field in fields.items():
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert ours.array_lengths[key] == len(field.data), key
        else:
            assert ours.fields[key] == field.contents(), key
    assert ours.array_lengths["tokenizer.ggml.tokens"] == len(TOKENS)
    assert ours.fields["test.after_arrays"] == "still read" and ours.fields["test.big"] == 2 ** 40 + 3
    assert [(t.name, t.shape, t.tensor_type) for t in ours.tensors] == \
        [(t.name, tuple(int(d) for d in t.shape), t.tensor_type) for t in theirs.tensors]
    assert ours.tensors[1].shape == (64, 3, 2) and ours.tensors[1].data.shape == (6, 256)
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert np.array_equal(mine.data.reshape(-1), np.asarray(reference.data).view(np.uint8).reshape(-1)), mine.name


def test_files_that_are_not_gguf_are_refused_clearly(tmp_path):
    """A wrong magic, a header cut short and tensor data cut short each raise the reader's error, which the
    model loader passes on as an unsupported GGUF (so `load_model` can fall back, or say why)."""
    path = tmp_path / "t.gguf"
    write_file(path)
    whole = path.read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGUG" + whole[4:])
    with pytest.raises(GgufFormatError, match="not a GGUF file"):
        read_gguf(tmp_path / "magic.gguf")
    (tmp_path / "header.gguf").write_bytes(whole[:whole.index(b"tok2000")])  # inside the tokens array
    with pytest.raises(GgufFormatError, match="past the end|inside its header"):
        read_gguf(tmp_path / "header.gguf")
    (tmp_path / "data.gguf").write_bytes(whole[:-100])
    with pytest.raises(GgufFormatError, match="Q4_K.weight runs past the end"):
        read_gguf(tmp_path / "data.gguf")
    with pytest.raises(UnsupportedGguf, match="not a GGUF file"):
        load_gguf_model(tmp_path / "magic.gguf", config=None)
