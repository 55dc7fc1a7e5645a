from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftProbsEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_PROBS_ENCODING_UNSPECIFIED: _ClassVar[DraftProbsEncoding]
    DRAFT_PROBS_ENCODING_DENSE_FP32: _ClassVar[DraftProbsEncoding]
    DRAFT_PROBS_ENCODING_DENSE_FP16: _ClassVar[DraftProbsEncoding]
    DRAFT_PROBS_ENCODING_SPARSE_FP32: _ClassVar[DraftProbsEncoding]
DRAFT_PROBS_ENCODING_UNSPECIFIED: DraftProbsEncoding
DRAFT_PROBS_ENCODING_DENSE_FP32: DraftProbsEncoding
DRAFT_PROBS_ENCODING_DENSE_FP16: DraftProbsEncoding
DRAFT_PROBS_ENCODING_SPARSE_FP32: DraftProbsEncoding

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class DraftProbs(_message.Message):
    __slots__ = ("encoding", "num_tokens", "vocab_size", "values", "indices", "row_nnz")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    ROW_NNZ_FIELD_NUMBER: _ClassVar[int]
    encoding: DraftProbsEncoding
    num_tokens: int
    vocab_size: int
    values: bytes
    indices: bytes
    row_nnz: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, encoding: _Optional[_Union[DraftProbsEncoding, str]] = ..., num_tokens: _Optional[int] = ..., vocab_size: _Optional[int] = ..., values: _Optional[bytes] = ..., indices: _Optional[bytes] = ..., row_nnz: _Optional[_Iterable[int]] = ...) -> None: ...
