"""A draft's q on the wire: [γ, V] probabilities to protobuf and back, exactly (the draft and target services; the
orchestrator forwards them encoded, `specdec.runtime.wire.probs_rows`)."""

from __future__ import annotations

import numpy as np
import torch

from protos import specdec_pb2 as pb
from specdec.core.errors import InvalidArgument


def encode_probs(probs: torch.Tensor | None) -> pb.DraftProbs:
    """q: [γ, V] or None -> the cheapest exact encoding (ids only, sparse rows, or dense float32)."""
    if probs is None:
        return pb.DraftProbs(none=True)
    probs = probs.to(torch.float32).cpu()
    support = int((probs > 0).sum())
    if support * 8 < probs.numel() * 4:  # sparse costs 8 bytes per nonzero, dense 4 per entry
        rows = []
        for row in probs:  # row: [V]
            ids = row.nonzero().squeeze(-1)
            rows.append(pb.SparseProbs(ids=ids.tolist(), probs=row[ids].tolist()))
        return pb.DraftProbs(sparse=pb.SparseDraftProbs(rows=rows))
    return pb.DraftProbs(dense_f32=probs.numpy().astype("<f4").tobytes())


def decode_probs(msg: pb.DraftProbs, gamma: int, vocab: int) -> torch.Tensor | None:
    """Inverse of `encode_probs`: [γ, V] float32 or None. Raises InvalidArgument on a bad shape."""
    kind = msg.WhichOneof("encoding")
    if kind in (None, "none"):
        return None
    if kind == "dense_f32":
        if len(msg.dense_f32) != gamma * vocab * 4:
            raise InvalidArgument(f"dense draft probabilities hold {len(msg.dense_f32)} bytes, "
                                  f"expected {gamma}x{vocab} float32")
        array = np.frombuffer(msg.dense_f32, dtype="<f4").reshape(gamma, vocab)
        return torch.from_numpy(array.copy())
    rows = msg.sparse.rows
    if len(rows) != gamma:
        raise InvalidArgument(f"sparse draft probabilities have {len(rows)} rows, expected {gamma}")
    out = torch.zeros(gamma, vocab, dtype=torch.float32)
    for i, row in enumerate(rows):
        if len(row.ids) != len(row.probs) or any(not 0 <= t < vocab for t in row.ids):
            raise InvalidArgument(f"sparse draft row {i} is malformed")
        out[i, list(row.ids)] = torch.tensor(list(row.probs), dtype=torch.float32)
    return out
