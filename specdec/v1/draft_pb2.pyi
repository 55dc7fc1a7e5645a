from specdec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_SOURCE_UNSPECIFIED: _ClassVar[DraftSource]
    DRAFT_SOURCE_NGRAM: _ClassVar[DraftSource]
    DRAFT_SOURCE_MODEL: _ClassVar[DraftSource]
    DRAFT_SOURCE_NGRAM_SHORT: _ClassVar[DraftSource]
    DRAFT_SOURCE_SUFFIX: _ClassVar[DraftSource]
DRAFT_SOURCE_UNSPECIFIED: DraftSource
DRAFT_SOURCE_NGRAM: DraftSource
DRAFT_SOURCE_MODEL: DraftSource
DRAFT_SOURCE_NGRAM_SHORT: DraftSource
DRAFT_SOURCE_SUFFIX: DraftSource

class ProposeRequest(_message.Message):
    __slots__ = ("session_id", "committed_len", "new_tokens", "num_draft_tokens", "sampling", "probs_encoding", "model_draft_tokens", "tree")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PROBS_ENCODING_FIELD_NUMBER: _ClassVar[int]
    MODEL_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    committed_len: int
    new_tokens: _containers.RepeatedScalarFieldContainer[int]
    num_draft_tokens: int
    sampling: _common_pb2.SamplingParams
    probs_encoding: _common_pb2.DraftProbsEncoding
    model_draft_tokens: int
    tree: bool
    def __init__(self, session_id: _Optional[str] = ..., committed_len: _Optional[int] = ..., new_tokens: _Optional[_Iterable[int]] = ..., num_draft_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., probs_encoding: _Optional[_Union[_common_pb2.DraftProbsEncoding, str]] = ..., model_draft_tokens: _Optional[int] = ..., tree: _Optional[bool] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("token_ids", "draft_probs", "cached_len", "source", "parent_indices")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    CACHED_LEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PARENT_INDICES_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: _common_pb2.DraftProbs
    cached_len: int
    source: DraftSource
    parent_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Union[_common_pb2.DraftProbs, _Mapping]] = ..., cached_len: _Optional[int] = ..., source: _Optional[_Union[DraftSource, str]] = ..., parent_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class EndSessionRequest(_message.Message):
    __slots__ = ("session_id", "completion_token_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    completion_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., completion_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EndSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
