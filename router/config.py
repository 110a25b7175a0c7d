"""The router's configuration: built once from the command line, never mutated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# How long the target keeps a router's claim after its last call (target_service/ownership.py):
# the wait of a router started after one that died (--target-claim-lease). The router's watch
# renews it every 0.25 s, so a lease of a second still outlasts a few slow renewals.
CLAIM_LEASE_S = 5.0
MIN_CLAIM_LEASE_S = 1.0


@dataclass(frozen=True)
class RouterConfig:
    model_path: Path  # for the tokenizer and chat template
    target_address: str
    host: str = "127.0.0.1"
    port: int = 50051
    max_queue: int = 1024  # waiting requests beyond this get RESOURCE_EXHAUSTED
    max_running: int = 64  # requests in the running batch
    max_step_tokens: int = 512  # tokens per target step; long prompts prefill in chunks
    default_max_new_tokens: int = 256
    max_new_tokens_limit: int = 4096
    reserve_block: int = 16  # slots reserved ahead per allocation, amortising allocator calls
    rpc_timeout_s: float = 120.0  # deadline of every call to a model service
    target_claim_lease_s: float = CLAIM_LEASE_S  # the target is ours this long after our last call
    draft_addresses: tuple[str, ...] = ()  # draft replicas; none: target-only
    draft_dns: tuple[str, ...] = ()  # host:port names re-resolved for draft replicas
    draft_dns_interval_s: float = 5.0  # how often each name is looked up again
    speculate_by_default: bool = True  # requests may still switch it per call
    max_tree_tokens: int = 64  # most nodes (root included) of a verified tree; slots reserved ahead
    draft_timeout_s: float = 10.0  # deadline of drafter calls: a slow replica counts as lost
    draft_deadline_floor_s: float = 0.02  # adaptive drafter deadlines are never shorter
    max_catch_up_per_step: int = 4  # drafter re-ingests started in one scheduler step
    max_speculative_batch: int = 32  # more decoding requests than this: target-only steps
    http_port: int = 0  # OpenAI-compatible HTTP API and /metrics (0: off)
    max_http_body_bytes: int = 8 << 20  # larger HTTP bodies are refused 413 unread
    served_model_name: str = ""  # the model name of the HTTP API; empty: the target's
    connect_timeout_s: float = 600.0  # how long start-up waits for the target to be healthy
    kv_policy: str = "reserve"  # or "retract": admit on the prefill, retract under pressure
    adaptive_speculation: bool = False  # speculate only where measured faster (spec_switch.py)
    log_requests: bool = False  # a log line per finished request (request_log.py)
    decode_steps: int = 0  # most steps of a target-only decode Forward; 0: the target's max
    grammar_bursts: bool = True  # greedy structured output decodes unmasked bursts too
    otlp_traces_endpoint: str = ""  # OTLP/gRPC collector of request spans; empty: no tracing
    otlp_service_name: str = "splitspec-router"  # the spans' service.name

    def __post_init__(self) -> None:
        for name in (
            "max_queue",
            "max_running",
            "max_step_tokens",
            "default_max_new_tokens",
            "max_new_tokens_limit",
            "reserve_block",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.decode_steps < 0:
            raise ValueError("decode_steps must be 0 (the target's) or positive")
