from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_ABORT: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("items", "tools")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: str
    def __init__(self, items: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[str] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "prompt_logprobs", "logit_bias", "min_p", "repetition_penalty", "min_tokens", "structured_output")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    presence_penalty: float
    frequency_penalty: float
    logprobs: bool
    top_logprobs: int
    prompt_logprobs: bool
    logit_bias: _containers.ScalarMap[int, float]
    min_p: float
    repetition_penalty: float
    min_tokens: int
    structured_output: StructuredOutput
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[bool] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_tokens: _Optional[int] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "grammar", "choice")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    grammar: str
    choice: Choices
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., grammar: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class SpeculationOptions(_message.Message):
    __slots__ = ("enabled", "forced_drafts")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    FORCED_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    forced_drafts: bool
    def __init__(self, enabled: _Optional[bool] = ..., forced_drafts: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("text", "messages", "input_ids", "request_id", "sampling", "speculation")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: ChatMessages
    input_ids: TokenIds
    request_id: str
    sampling: SamplingParams
    speculation: SpeculationOptions
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., input_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., request_id: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationOptions, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "time_to_first_token_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class SpeculationStats(_message.Message):
    __slots__ = ("verify_steps", "draft_tokens", "accepted_tokens", "mean_acceptance_length", "forced_tokens")
    VERIFY_STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    verify_steps: int
    draft_tokens: int
    accepted_tokens: int
    mean_acceptance_length: float
    forced_tokens: int
    def __init__(self, verify_steps: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., mean_acceptance_length: _Optional[float] = ..., forced_tokens: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "token", "token_bytes")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    token: str
    token_bytes: bytes
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., token: _Optional[str] = ..., token_bytes: _Optional[bytes] = ...) -> None: ...

class LogprobEntry(_message.Message):
    __slots__ = ("chosen", "top")
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    chosen: TokenLogprob
    top: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, chosen: _Optional[_Union[TokenLogprob, _Mapping]] = ..., top: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "finish_reason", "usage", "timings", "speculation", "matched_stop", "logprobs", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    speculation: SpeculationStats
    matched_stop: str
    logprobs: _containers.RepeatedCompositeFieldContainer[LogprobEntry]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[LogprobEntry]
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationStats, _Mapping]] = ..., matched_stop: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[LogprobEntry, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[LogprobEntry, _Mapping]]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_name", "architecture", "vocab_size", "max_context_length", "max_new_tokens_limit", "eos_token_ids", "dtype", "device", "has_chat_template")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    architecture: str
    vocab_size: int
    max_context_length: int
    max_new_tokens_limit: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    device: str
    has_chat_template: bool
    def __init__(self, model_name: _Optional[str] = ..., architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context_length: _Optional[int] = ..., max_new_tokens_limit: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., has_chat_template: _Optional[bool] = ...) -> None: ...

class GetServerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DraftReplicaStatus(_message.Message):
    __slots__ = ("address", "method", "healthy", "num_requests", "source", "error")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    address: str
    method: str
    healthy: bool
    num_requests: int
    source: str
    error: str
    def __init__(self, address: _Optional[str] = ..., method: _Optional[str] = ..., healthy: _Optional[bool] = ..., num_requests: _Optional[int] = ..., source: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class DraftDiscoveryStatus(_message.Message):
    __slots__ = ("name", "addresses", "last_resolved_unix_s", "last_attempt_unix_s", "error", "num_lookups")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    LAST_RESOLVED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LAST_ATTEMPT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    last_resolved_unix_s: float
    last_attempt_unix_s: float
    error: str
    num_lookups: int
    def __init__(self, name: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., last_resolved_unix_s: _Optional[float] = ..., last_attempt_unix_s: _Optional[float] = ..., error: _Optional[str] = ..., num_lookups: _Optional[int] = ...) -> None: ...

class ServerStatus(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_total_slots", "num_free_slots", "num_cached_tokens", "num_finished_requests", "num_generated_tokens", "uptime_s", "speculation", "draft_replicas", "draft_discovery", "num_retractions", "speculation_switch", "target_only_steps", "speculative_steps", "decode_steps", "multi_step_forwards", "grammar_bursts", "grammar_bursts_cut", "unavailable_reason")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DISCOVERY_FIELD_NUMBER: _ClassVar[int]
    NUM_RETRACTIONS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_SWITCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_ONLY_STEPS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    MULTI_STEP_FORWARDS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BURSTS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BURSTS_CUT_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_total_slots: int
    num_free_slots: int
    num_cached_tokens: int
    num_finished_requests: int
    num_generated_tokens: int
    uptime_s: float
    speculation: SpeculationStats
    draft_replicas: _containers.RepeatedCompositeFieldContainer[DraftReplicaStatus]
    draft_discovery: _containers.RepeatedCompositeFieldContainer[DraftDiscoveryStatus]
    num_retractions: int
    speculation_switch: SpeculationSwitchStatus
    target_only_steps: StepTiming
    speculative_steps: StepTiming
    decode_steps: int
    multi_step_forwards: int
    grammar_bursts: int
    grammar_bursts_cut: int
    unavailable_reason: str
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_total_slots: _Optional[int] = ..., num_free_slots: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., num_finished_requests: _Optional[int] = ..., num_generated_tokens: _Optional[int] = ..., uptime_s: _Optional[float] = ..., speculation: _Optional[_Union[SpeculationStats, _Mapping]] = ..., draft_replicas: _Optional[_Iterable[_Union[DraftReplicaStatus, _Mapping]]] = ..., draft_discovery: _Optional[_Iterable[_Union[DraftDiscoveryStatus, _Mapping]]] = ..., num_retractions: _Optional[int] = ..., speculation_switch: _Optional[_Union[SpeculationSwitchStatus, _Mapping]] = ..., target_only_steps: _Optional[_Union[StepTiming, _Mapping]] = ..., speculative_steps: _Optional[_Union[StepTiming, _Mapping]] = ..., decode_steps: _Optional[int] = ..., multi_step_forwards: _Optional[int] = ..., grammar_bursts: _Optional[int] = ..., grammar_bursts_cut: _Optional[int] = ..., unavailable_reason: _Optional[str] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("steps", "step_ms", "target_call_ms", "target_compute_ms", "draft_call_ms", "draft_compute_ms", "target_device_ms", "draft_device_ms")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_CALL_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_CALL_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_DEVICE_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DEVICE_MS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    step_ms: float
    target_call_ms: float
    target_compute_ms: float
    draft_call_ms: float
    draft_compute_ms: float
    target_device_ms: float
    draft_device_ms: float
    def __init__(self, steps: _Optional[int] = ..., step_ms: _Optional[float] = ..., target_call_ms: _Optional[float] = ..., target_compute_ms: _Optional[float] = ..., draft_call_ms: _Optional[float] = ..., draft_compute_ms: _Optional[float] = ..., target_device_ms: _Optional[float] = ..., draft_device_ms: _Optional[float] = ...) -> None: ...

class SpeculationSwitchBucket(_message.Message):
    __slots__ = ("batch_size", "speculative_tok_s", "target_only_tok_s", "speculating", "speculative_steps", "target_only_steps", "probing", "num_probes", "num_switches")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_TOK_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_ONLY_TOK_S_FIELD_NUMBER: _ClassVar[int]
    SPECULATING_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_STEPS_FIELD_NUMBER: _ClassVar[int]
    TARGET_ONLY_STEPS_FIELD_NUMBER: _ClassVar[int]
    PROBING_FIELD_NUMBER: _ClassVar[int]
    NUM_PROBES_FIELD_NUMBER: _ClassVar[int]
    NUM_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    speculative_tok_s: float
    target_only_tok_s: float
    speculating: bool
    speculative_steps: int
    target_only_steps: int
    probing: bool
    num_probes: int
    num_switches: int
    def __init__(self, batch_size: _Optional[int] = ..., speculative_tok_s: _Optional[float] = ..., target_only_tok_s: _Optional[float] = ..., speculating: _Optional[bool] = ..., speculative_steps: _Optional[int] = ..., target_only_steps: _Optional[int] = ..., probing: _Optional[bool] = ..., num_probes: _Optional[int] = ..., num_switches: _Optional[int] = ...) -> None: ...

class SpeculationSwitchStatus(_message.Message):
    __slots__ = ("enabled", "num_switches", "buckets", "num_probes", "num_prefill_holds")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    NUM_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROBES_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFILL_HOLDS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    num_switches: int
    buckets: _containers.RepeatedCompositeFieldContainer[SpeculationSwitchBucket]
    num_probes: int
    num_prefill_holds: int
    def __init__(self, enabled: _Optional[bool] = ..., num_switches: _Optional[int] = ..., buckets: _Optional[_Iterable[_Union[SpeculationSwitchBucket, _Mapping]]] = ..., num_probes: _Optional[int] = ..., num_prefill_holds: _Optional[int] = ...) -> None: ...
