"""Draft probabilities q on the wire.

Only sampled rounds carry q (greedy rounds send token ids alone). Dense rows cost vocab floats
each (1 MiB per token for Gemma 3's 262,144-token vocabulary in fp32), so when top-k/top-p leave
a small support the sparse form (int32 index + fp32 value per non-zero) is both exact and far
smaller. fp16 halves dense rows but rounds q: a drafter using it must draw its tokens from the
unpacked q, which `roundtrip` gives, or the acceptance test would use a q the tokens never saw.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.core.errors import InvalidArgument
from specdec.v1.common_pb2 import (
    DRAFT_PROBS_ENCODING_DENSE_FP16,
    DRAFT_PROBS_ENCODING_DENSE_FP32,
    DRAFT_PROBS_ENCODING_SPARSE_FP32,
    DRAFT_PROBS_ENCODING_UNSPECIFIED,
    DraftProbs,
)

_SPARSE_BYTES_PER_NONZERO = 8  # int32 index + fp32 value
_DENSE_DTYPES = {DRAFT_PROBS_ENCODING_DENSE_FP32: "<f4", DRAFT_PROBS_ENCODING_DENSE_FP16: "<f2"}
_FIELD = "draft_probs"
# The largest q (rows x vocab) a receiver builds: 256 MiB of fp32, what the draft client accepts
# in one message. A sparse message names its shape in two integers, so without this bound a few
# bytes could ask for terabytes.
MAX_ELEMENTS = 1 << 26
# Rows are distributions: a float32 softmax sums to 1 within ~1e-6, so this only refuses garbage
# (the acceptance rule reads q as it comes, unnormalized).
_MASS_TOLERANCE = 1e-2


def choose_encoding(q: torch.Tensor) -> int:
    """The exact encoding with fewer bytes: sparse fp32 or dense fp32."""
    nonzeros = int(torch.count_nonzero(q))
    dense_bytes = q.numel() * 4
    if nonzeros * _SPARSE_BYTES_PER_NONZERO < dense_bytes:
        return DRAFT_PROBS_ENCODING_SPARSE_FP32
    return DRAFT_PROBS_ENCODING_DENSE_FP32


def pack_probs(q: torch.Tensor, encoding: int = DRAFT_PROBS_ENCODING_UNSPECIFIED) -> DraftProbs:
    """q: (k, vocab) non-negative rows -> DraftProbs. UNSPECIFIED picks the smaller exact form."""
    if q.dim() != 2:
        raise ValueError(f"q must be (k, vocab), got shape {tuple(q.shape)}")
    if encoding == DRAFT_PROBS_ENCODING_UNSPECIFIED:
        encoding = choose_encoding(q)
    k, vocab = q.shape
    msg = DraftProbs(encoding=encoding, num_tokens=k, vocab_size=vocab)
    q = q.detach().float().cpu()
    if encoding in _DENSE_DTYPES:
        msg.values = q.numpy().astype(_DENSE_DTYPES[encoding]).tobytes()
    elif encoding == DRAFT_PROBS_ENCODING_SPARSE_FP32:
        rows, cols = torch.nonzero(q, as_tuple=True)  # row-major order
        msg.indices = cols.numpy().astype("<i4").tobytes()
        msg.values = q[rows, cols].numpy().astype("<f4").tobytes()
        msg.row_nnz.extend(torch.bincount(rows, minlength=k).tolist())
    else:
        raise ValueError(f"unknown draft probs encoding {encoding}")
    return msg


def unpack_probs(msg: DraftProbs, *, num_tokens: int | None = None, vocab_size: int | None = None) -> torch.Tensor:
    """DraftProbs -> (k, vocab) fp32 rows that are distributions (finite, >= 0, summing to 1).
    Anything else raises InvalidArgument naming the field, and only that, because these bytes
    come off the network."""
    k, vocab = msg.num_tokens, msg.vocab_size
    if num_tokens is not None and k != num_tokens:
        raise InvalidArgument(f"{_FIELD}.num_tokens", f"is {k}, expected {num_tokens}")
    if vocab_size is not None and vocab != vocab_size:
        raise InvalidArgument(f"{_FIELD}.vocab_size", f"is {vocab}, expected {vocab_size}")
    if vocab == 0:
        raise InvalidArgument(f"{_FIELD}.vocab_size", "must be > 0")
    if k * vocab > MAX_ELEMENTS:
        raise InvalidArgument(f"{_FIELD}.num_tokens", f"{k} rows of {vocab} exceed {MAX_ELEMENTS} probabilities")
    if msg.encoding in _DENSE_DTYPES:
        dtype = np.dtype(_DENSE_DTYPES[msg.encoding])
        if len(msg.values) != k * vocab * dtype.itemsize:
            raise InvalidArgument(
                f"{_FIELD}.values", f"has {len(msg.values)} bytes, expected {k * vocab * dtype.itemsize}"
            )
        q = torch.from_numpy(np.frombuffer(msg.values, dtype=dtype).astype(np.float32).reshape(k, vocab))
    elif msg.encoding == DRAFT_PROBS_ENCODING_SPARSE_FP32:
        if len(msg.row_nnz) != k:
            raise InvalidArgument(f"{_FIELD}.row_nnz", f"has {len(msg.row_nnz)} rows, expected {k}")
        nnz = sum(msg.row_nnz)
        if len(msg.indices) != 4 * nnz or len(msg.values) != 4 * nnz:
            raise InvalidArgument(f"{_FIELD}.indices", f"sizes disagree with row_nnz total {nnz}")
        cols = torch.from_numpy(np.frombuffer(msg.indices, dtype="<i4").astype(np.int64))
        if nnz and (int(cols.min()) < 0 or int(cols.max()) >= vocab):
            raise InvalidArgument(f"{_FIELD}.indices", f"token id outside [0, {vocab})")
        rows = torch.repeat_interleave(torch.arange(k), torch.tensor(list(msg.row_nnz), dtype=torch.int64))
        q = torch.zeros(k, vocab)
        q[rows, cols] = torch.from_numpy(np.frombuffer(msg.values, dtype="<f4").copy())
    else:
        raise InvalidArgument(f"{_FIELD}.encoding", f"unknown value {msg.encoding}")
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        raise InvalidArgument(f"{_FIELD}.values", "must be finite and >= 0")
    if k and bool(((q.sum(dim=-1, dtype=torch.float64) - 1).abs() > _MASS_TOLERANCE).any()):
        raise InvalidArgument(f"{_FIELD}.values", f"every row must sum to 1 (within {_MASS_TOLERANCE})")
    return q


def roundtrip(q: torch.Tensor, encoding: int) -> torch.Tensor:
    """q as the receiver will see it: draw draft tokens from this when packing is lossy."""
    return unpack_probs(pack_probs(q, encoding))
