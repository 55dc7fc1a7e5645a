"""Draft probabilities survive the wire: sparse and dense fp32 exactly, fp16 as `roundtrip` says."""

from __future__ import annotations

import pytest
import torch

from specdec.core.errors import InvalidArgument
from specdec.core.packing import choose_encoding, pack_probs, roundtrip, unpack_probs
from specdec.core.sampling import SamplingParams, warp
from specdec.v1 import common_pb2 as pb


def _q(vocab: int = 1000, top_k: int = 0) -> torch.Tensor:
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    return warp(logits, SamplingParams(temperature=0.8, top_k=top_k))  # (4, vocab)


@pytest.mark.parametrize("encoding", [pb.DRAFT_PROBS_ENCODING_DENSE_FP32, pb.DRAFT_PROBS_ENCODING_SPARSE_FP32])
def test_exact_encodings_roundtrip_bit_for_bit(encoding):
    q = _q(top_k=20)
    assert torch.equal(unpack_probs(pack_probs(q, encoding)), q)


def test_auto_choice_is_sparse_for_small_support_and_dense_otherwise():
    small, full = _q(top_k=20), _q()
    assert choose_encoding(small) == pb.DRAFT_PROBS_ENCODING_SPARSE_FP32
    assert choose_encoding(full) == pb.DRAFT_PROBS_ENCODING_DENSE_FP32
    sparse_bytes = pack_probs(small).ByteSize()
    assert sparse_bytes < pack_probs(small, pb.DRAFT_PROBS_ENCODING_DENSE_FP32).ByteSize() / 10


def test_fp16_is_close_and_roundtrip_is_what_the_receiver_sees():
    q = _q()
    seen = roundtrip(q, pb.DRAFT_PROBS_ENCODING_DENSE_FP16)
    assert torch.allclose(seen, q, atol=1e-3)
    assert torch.equal(unpack_probs(pack_probs(seen, pb.DRAFT_PROBS_ENCODING_DENSE_FP16)), seen)


def _corrupt(**changes) -> pb.DraftProbs:
    msg = pack_probs(_q(vocab=50, top_k=5), pb.DRAFT_PROBS_ENCODING_SPARSE_FP32)
    for name, value in changes.items():
        if name == "row_nnz":
            del msg.row_nnz[:]
            msg.row_nnz.extend(value)
        else:
            setattr(msg, name, value)
    return msg


@pytest.mark.parametrize(
    "msg, field",
    [
        (_corrupt(encoding=9), "draft_probs.encoding"),
        (_corrupt(vocab_size=0), "draft_probs.vocab_size"),
        (_corrupt(indices=b"\x00\x01"), "draft_probs.indices"),
        (_corrupt(indices=b"\xff\xff\xff\x7f" * 20), "draft_probs.indices"),  # id far outside the vocabulary
        (_corrupt(row_nnz=[5, 5]), "draft_probs.row_nnz"),
        (_corrupt(values=b"\x00\x00\xc0\x7f" * 20), "draft_probs.values"),  # NaN
        (_corrupt(values=b"\x00\x00\x00\x00" * 20), "draft_probs.values"),  # rows without mass
        (
            pb.DraftProbs(encoding=pb.DRAFT_PROBS_ENCODING_DENSE_FP32, num_tokens=2, vocab_size=4, values=b"\x00" * 7),
            "draft_probs.values",
        ),
    ],
)
def test_malformed_messages_name_the_field(msg, field):
    with pytest.raises(InvalidArgument) as info:
        unpack_probs(msg)
    assert info.value.field == field


def test_shape_expectations_are_checked():
    msg = pack_probs(_q(vocab=50))
    with pytest.raises(InvalidArgument, match="num_tokens"):
        unpack_probs(msg, num_tokens=3)
    with pytest.raises(InvalidArgument, match="vocab_size"):
        unpack_probs(msg, vocab_size=51)
