from protos import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContextUpdate(_message.Message):
    __slots__ = ("request_id", "start_pos", "token_ids", "hidden_start_pos", "hidden")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_START_POS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_pos: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    hidden_start_pos: int
    hidden: _tensor_pb2.Tensor
    def __init__(self, request_id: _Optional[str] = ..., start_pos: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., hidden_start_pos: _Optional[int] = ..., hidden: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class ProposeItem(_message.Message):
    __slots__ = ("update", "round")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    update: ContextUpdate
    round: int
    def __init__(self, update: _Optional[_Union[ContextUpdate, _Mapping]] = ..., round: _Optional[int] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ProposeItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ProposeItem, _Mapping]]] = ...) -> None: ...

class DraftTree(_message.Message):
    __slots__ = ("request_id", "token_ids", "parent_indices", "scores", "needs_context")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARENT_INDICES_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    NEEDS_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    parent_indices: _containers.RepeatedScalarFieldContainer[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    needs_context: bool
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., parent_indices: _Optional[_Iterable[int]] = ..., scores: _Optional[_Iterable[float]] = ..., needs_context: _Optional[bool] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("trees", "compute_ms", "device_ms")
    TREES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MS_FIELD_NUMBER: _ClassVar[int]
    trees: _containers.RepeatedCompositeFieldContainer[DraftTree]
    compute_ms: float
    device_ms: float
    def __init__(self, trees: _Optional[_Iterable[_Union[DraftTree, _Mapping]]] = ..., compute_ms: _Optional[float] = ..., device_ms: _Optional[float] = ...) -> None: ...

class IngestChunk(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: ContextUpdate
    def __init__(self, update: _Optional[_Union[ContextUpdate, _Mapping]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("num_tokens", "num_hidden_rows", "compute_ms")
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_HIDDEN_ROWS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    num_tokens: int
    num_hidden_rows: int
    compute_ms: float
    def __init__(self, num_tokens: _Optional[int] = ..., num_hidden_rows: _Optional[int] = ..., compute_ms: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_ids", "all")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("num_released",)
    NUM_RELEASED_FIELD_NUMBER: _ClassVar[int]
    num_released: int
    def __init__(self, num_released: _Optional[int] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DraftInfo(_message.Message):
    __slots__ = ("method", "needs_hidden", "hidden_size", "num_steps", "topk", "num_draft_tokens", "device", "dtype", "vocab_size", "num_requests")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    NEEDS_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    TOPK_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    method: str
    needs_hidden: bool
    hidden_size: int
    num_steps: int
    topk: int
    num_draft_tokens: int
    device: str
    dtype: str
    vocab_size: int
    num_requests: int
    def __init__(self, method: _Optional[str] = ..., needs_hidden: _Optional[bool] = ..., hidden_size: _Optional[int] = ..., num_steps: _Optional[int] = ..., topk: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., vocab_size: _Optional[int] = ..., num_requests: _Optional[int] = ...) -> None: ...
