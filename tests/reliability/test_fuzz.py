"""Property-based fuzzing (hypothesis) of what parses untrusted bytes.

- The request validator: any GenerateRequest, or any bytes at all, is either accepted by
  `SpeculativeEngine.prepare` (through `request_from_proto`, as the server calls it) with every
  documented bound holding, or refused with `InvalidArgument`; never any other exception.
- The draft-probability unpacking: any DraftProbs message gives (k, vocab) rows that are
  distributions, or `InvalidArgument` naming a draft_probs field; never any other exception.

Derandomized with a fixed number of examples and a deadline, so a run is the same run every time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.coordinator.convert import request_from_proto
from specdec.coordinator.engine import EngineConfig, SpeculativeEngine
from specdec.coordinator.server import _why_unparsable
from specdec.core.errors import InvalidArgument
from specdec.core.packing import MAX_ELEMENTS, pack_probs, unpack_probs
from specdec.core.sampling import MIN_TEMPERATURE
from specdec.v1 import common_pb2
from specdec.v1 import generation_pb2 as pb

FUZZ = settings(
    max_examples=200,
    derandomize=True,
    deadline=5000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

UINT32, UINT64, INT32 = (0, 2**32 - 1), (0, 2**64 - 1), (-(2**31), 2**31 - 1)


def edge_ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in [low, high], with the ends and small values drawn often."""
    return st.one_of(
        st.integers(low, high),
        st.sampled_from([low, high, 0, 1, 2]).filter(lambda v: low <= v <= high),
        st.integers(max(low, -3), min(high, 300)),
    )


floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
texts = st.text(max_size=40) | st.sampled_from(["", "a b c " * 200, "\x00", "\U0001f600" * 3])


@st.composite
def generate_requests(draw):
    msg = pb.GenerateRequest()
    if draw(st.booleans()):
        msg.prompt = draw(texts)
    if draw(st.booleans()):
        msg.prompt_token_ids.extend(
            draw(st.lists(edge_ints(*INT32), max_size=20) | st.lists(st.integers(0, 300), min_size=250, max_size=260))
        )
    msg.max_new_tokens = draw(edge_ints(*UINT32))
    if draw(st.booleans()):
        msg.sampling.temperature = draw(floats32)
        msg.sampling.top_p = draw(floats32)
        msg.sampling.top_k = draw(edge_ints(*UINT32))
        if draw(st.booleans()):
            msg.sampling.seed = draw(edge_ints(*UINT64))
    msg.stop.extend(draw(st.lists(texts, max_size=4) | st.lists(st.just("x"), min_size=60, max_size=80)))
    if draw(st.booleans()):
        msg.speculation.disabled = draw(st.booleans())
        msg.speculation.max_draft_tokens = draw(edge_ints(*UINT32))
    return msg


@pytest.fixture(scope="module")
def engine(tiny):
    target = tiny("llama", 1)  # prepare reads only the tokenizer, the vocabulary and the context
    return SpeculativeEngine(proposer=None, verifier=None, target=target, config=EngineConfig(max_draft_tokens=8))


def check_prepare(engine: SpeculativeEngine, msg) -> None:
    try:
        prompt, request = engine.prepare(request_from_proto(msg))
    except InvalidArgument as e:
        assert e.field and str(e).startswith(f"{e.field}: ")
        return
    target, config = engine.target, engine.config
    assert 1 <= len(prompt) < target.max_context and all(0 <= t < target.vocab_size for t in prompt)
    assert 1 <= request.max_new_tokens <= target.max_context - len(prompt)
    s = request.sampling
    assert (
        math.isfinite(s.temperature)
        and (s.temperature == 0 or s.temperature >= MIN_TEMPERATURE)
        and 0 <= s.top_p <= 1
        and s.top_k >= 0
    )
    assert s.greedy or 0 <= s.seed < 2**64  # a sampled request always has a seed after prepare
    assert 0 <= request.max_draft_tokens <= config.max_draft_tokens
    assert all(isinstance(x, str) for x in request.stop)


@FUZZ
@given(msg=generate_requests())
def test_the_validator_accepts_or_names_the_field(engine, msg):
    check_prepare(engine, msg)
    check_prepare(engine, pb.GenerateStreamRequest.FromString(msg.SerializeToString()))


@FUZZ
@given(
    raw=st.binary(max_size=200)
    | generate_requests()
    .map(lambda m: m.SerializeToString())
    .flatmap(
        lambda b: st.tuples(st.just(b), st.binary(max_size=8), st.integers(0, len(b))).map(
            lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :]
        )
    )
)
def test_any_bytes_parse_or_are_refused_with_a_reason(engine, raw):
    """What the server does with a call's bytes: parse, or say why not (never raise from that)."""
    try:
        msg = pb.GenerateRequest.FromString(raw)
    except DecodeError:
        problem = _why_unparsable(pb.GenerateRequest.DESCRIPTOR, raw)
        assert problem is None or ": " in problem
        return
    check_prepare(engine, msg)


# --- DraftProbs ---------------------------------------------------------------------------------------------

ENCODINGS = [v for v in common_pb2.DraftProbsEncoding.values()] + [4, 99, -1, 2**31 - 1]


@st.composite
def draft_probs(draw):
    """Well-formed messages, the same bent one way or another, and arbitrary ones."""
    k, vocab = draw(st.integers(0, 4)), draw(st.integers(1, 24))
    q = torch.tensor(
        draw(st.lists(st.floats(0, 1, width=32), min_size=k * vocab, max_size=k * vocab)), dtype=torch.float32
    ).reshape(k, vocab)
    if k and draw(st.booleans()):
        q = q / q.sum(dim=-1, keepdim=True).clamp_min(1e-30)  # mostly distributions, some rows zero
    encoding = draw(
        st.sampled_from(
            [
                common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP32,
                common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP16,
                common_pb2.DRAFT_PROBS_ENCODING_SPARSE_FP32,
            ]
        )
    )
    msg = pack_probs(q, encoding)
    for _ in range(draw(st.integers(0, 3))):
        which = draw(
            st.sampled_from(["encoding", "num_tokens", "vocab_size", "values", "indices", "row_nnz", "special"])
        )
        if which == "encoding":
            msg.encoding = draw(st.sampled_from(ENCODINGS))
        elif which in ("num_tokens", "vocab_size"):
            setattr(msg, which, draw(edge_ints(*UINT32)))
        elif which in ("values", "indices"):
            setattr(msg, which, draw(st.binary(max_size=64) | st.just(bytes(getattr(msg, which))[:-1])))
        elif which == "row_nnz":
            del msg.row_nnz[:]
            msg.row_nnz.extend(draw(st.lists(edge_ints(*UINT32), max_size=6)))
        else:  # NaN, inf, negative, huge values in place of good ones
            value = draw(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 3e38, 1e-45]))
            dtype = np.dtype("<f2" if msg.encoding == common_pb2.DRAFT_PROBS_ENCODING_DENSE_FP16 else "<f4")
            if len(msg.values) and len(msg.values) % dtype.itemsize == 0:
                raw = np.frombuffer(msg.values, dtype=dtype).copy()
                with np.errstate(over="ignore"):
                    raw[draw(st.integers(0, raw.size - 1))] = value
                msg.values = raw.tobytes()
    return msg


@FUZZ
@given(msg=draft_probs(), expect=st.sampled_from([None, "num_tokens", "vocab_size"]))
def test_unpack_gives_distributions_or_names_the_field(msg, expect):
    kwargs = {}
    if expect == "num_tokens":
        kwargs["num_tokens"] = msg.num_tokens
    elif expect == "vocab_size":
        kwargs["vocab_size"] = msg.vocab_size
    try:
        q = unpack_probs(msg, **kwargs)
    except InvalidArgument as e:
        assert e.field.startswith("draft_probs.")
        return
    assert q.dtype == torch.float32 and tuple(q.shape) == (msg.num_tokens, msg.vocab_size)
    assert q.numel() <= MAX_ELEMENTS
    assert bool(torch.isfinite(q).all()) and bool((q >= 0).all())
    if q.shape[0]:
        assert torch.allclose(
            q.sum(dim=-1, dtype=torch.float64), torch.ones(q.shape[0], dtype=torch.float64), atol=1e-2
        )


@FUZZ
@given(
    encoding=st.sampled_from(ENCODINGS),
    k=edge_ints(*UINT32),
    vocab=edge_ints(*UINT32),
    values=st.binary(max_size=64),
    indices=st.binary(max_size=64),
    row_nnz=st.lists(edge_ints(*UINT32), max_size=6),
)
def test_unpack_of_arbitrary_fields_never_crashes(encoding, k, vocab, values, indices, row_nnz):
    msg = common_pb2.DraftProbs(
        encoding=encoding, num_tokens=k, vocab_size=vocab, values=values, indices=indices, row_nnz=row_nnz
    )
    try:
        q = unpack_probs(msg)
    except InvalidArgument as e:
        assert e.field.startswith("draft_probs.")
        return
    assert tuple(q.shape) == (k, vocab) and bool(torch.isfinite(q).all())
