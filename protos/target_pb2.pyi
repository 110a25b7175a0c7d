from protos import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingConfig(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "min_p", "repetition_penalty", "min_tokens", "repetition_context", "min_tokens_banned_ids")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_BANNED_IDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    presence_penalty: float
    frequency_penalty: float
    logprobs: bool
    top_logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    min_p: float
    repetition_penalty: float
    min_tokens: int
    repetition_context: _containers.RepeatedScalarFieldContainer[int]
    min_tokens_banned_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_tokens: _Optional[int] = ..., repetition_context: _Optional[_Iterable[int]] = ..., min_tokens_banned_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ForwardItem(_message.Message):
    __slots__ = ("request_id", "token_ids", "start_pos", "new_slots", "sample", "sampling", "scored_ids", "allowed_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    START_POS_FIELD_NUMBER: _ClassVar[int]
    NEW_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SCORED_IDS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    start_pos: int
    new_slots: _containers.RepeatedScalarFieldContainer[int]
    sample: bool
    sampling: SamplingConfig
    scored_ids: _containers.RepeatedScalarFieldContainer[int]
    allowed_tokens: bytes
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., start_pos: _Optional[int] = ..., new_slots: _Optional[_Iterable[int]] = ..., sample: _Optional[bool] = ..., sampling: _Optional[_Union[SamplingConfig, _Mapping]] = ..., scored_ids: _Optional[_Iterable[int]] = ..., allowed_tokens: _Optional[bytes] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("items", "decode_steps")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ForwardItem]
    decode_steps: int
    def __init__(self, items: _Optional[_Iterable[_Union[ForwardItem, _Mapping]]] = ..., decode_steps: _Optional[int] = ...) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("token_logprobs", "top_ids", "top_logprobs")
    TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_logprobs: _containers.RepeatedScalarFieldContainer[float]
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_logprobs: _Optional[_Iterable[float]] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ForwardResponse(_message.Message):
    __slots__ = ("next_token_ids", "forward_ms", "device_ms", "logprobs", "scored")
    NEXT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_MS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SCORED_FIELD_NUMBER: _ClassVar[int]
    next_token_ids: _containers.RepeatedScalarFieldContainer[int]
    forward_ms: float
    device_ms: float
    logprobs: _containers.RepeatedCompositeFieldContainer[Logprobs]
    scored: _containers.RepeatedCompositeFieldContainer[Logprobs]
    def __init__(self, next_token_ids: _Optional[_Iterable[int]] = ..., forward_ms: _Optional[float] = ..., device_ms: _Optional[float] = ..., logprobs: _Optional[_Iterable[_Union[Logprobs, _Mapping]]] = ..., scored: _Optional[_Iterable[_Union[Logprobs, _Mapping]]] = ...) -> None: ...

class VerifyItem(_message.Message):
    __slots__ = ("request_id", "start_pos", "token_ids", "parent_indices", "new_slots", "return_hidden", "allowed_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARENT_INDICES_FIELD_NUMBER: _ClassVar[int]
    NEW_SLOTS_FIELD_NUMBER: _ClassVar[int]
    RETURN_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_pos: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    parent_indices: _containers.RepeatedScalarFieldContainer[int]
    new_slots: _containers.RepeatedScalarFieldContainer[int]
    return_hidden: bool
    allowed_tokens: bytes
    def __init__(self, request_id: _Optional[str] = ..., start_pos: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., parent_indices: _Optional[_Iterable[int]] = ..., new_slots: _Optional[_Iterable[int]] = ..., return_hidden: _Optional[bool] = ..., allowed_tokens: _Optional[bytes] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[VerifyItem]
    def __init__(self, items: _Optional[_Iterable[_Union[VerifyItem, _Mapping]]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("token_ids", "num_accepted", "hidden", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_accepted: int
    hidden: _tensor_pb2.Tensor
    logprobs: Logprobs
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., num_accepted: _Optional[int] = ..., hidden: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("results", "forward_ms", "device_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_MS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    forward_ms: float
    device_ms: float
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ..., forward_ms: _Optional[float] = ..., device_ms: _Optional[float] = ...) -> None: ...

class ReadHiddenRequest(_message.Message):
    __slots__ = ("request_id", "start_pos", "end_pos", "rows_per_chunk")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POS_FIELD_NUMBER: _ClassVar[int]
    END_POS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_pos: int
    end_pos: int
    rows_per_chunk: int
    def __init__(self, request_id: _Optional[str] = ..., start_pos: _Optional[int] = ..., end_pos: _Optional[int] = ..., rows_per_chunk: _Optional[int] = ...) -> None: ...

class HiddenChunk(_message.Message):
    __slots__ = ("start_pos", "hidden")
    START_POS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    start_pos: int
    hidden: _tensor_pb2.Tensor
    def __init__(self, start_pos: _Optional[int] = ..., hidden: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

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

class ClaimRequest(_message.Message):
    __slots__ = ("router_id", "router_name", "lease_s", "give_up")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTER_NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    GIVE_UP_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    router_name: str
    lease_s: float
    give_up: bool
    def __init__(self, router_id: _Optional[str] = ..., router_name: _Optional[str] = ..., lease_s: _Optional[float] = ..., give_up: _Optional[bool] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("model_name", "architecture", "vocab_size", "max_context_length", "num_slots", "hidden_size", "dtype", "device", "max_batch_tokens", "max_requests", "max_tree_tokens", "decode_graph_batches", "exact_numerics", "max_decode_steps", "masked_verify_graph_batch", "num_requests")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TREE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_GRAPH_BATCHES_FIELD_NUMBER: _ClassVar[int]
    EXACT_NUMERICS_FIELD_NUMBER: _ClassVar[int]
    MAX_DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    MASKED_VERIFY_GRAPH_BATCH_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    architecture: str
    vocab_size: int
    max_context_length: int
    num_slots: int
    hidden_size: int
    dtype: str
    device: str
    max_batch_tokens: int
    max_requests: int
    max_tree_tokens: int
    decode_graph_batches: _containers.RepeatedScalarFieldContainer[int]
    exact_numerics: bool
    max_decode_steps: int
    masked_verify_graph_batch: int
    num_requests: int
    def __init__(self, model_name: _Optional[str] = ..., architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context_length: _Optional[int] = ..., num_slots: _Optional[int] = ..., hidden_size: _Optional[int] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., max_batch_tokens: _Optional[int] = ..., max_requests: _Optional[int] = ..., max_tree_tokens: _Optional[int] = ..., decode_graph_batches: _Optional[_Iterable[int]] = ..., exact_numerics: _Optional[bool] = ..., max_decode_steps: _Optional[int] = ..., masked_verify_graph_batch: _Optional[int] = ..., num_requests: _Optional[int] = ...) -> None: ...
