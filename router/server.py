"""Runs the router: `python -m router` or `splitspec router`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import Callable

import grpc

from plumbing import cpu_wake
from plumbing.flag_hints import HintingParser
from plumbing.grpc_util import (
    SERVER_OPTIONS,
    add_health_and_reflection_aio,
    bind_or_exit,
)
from plumbing.lifecycle import die_with_parent_if_asked
from plumbing.logs import setup_logging
from plumbing.security import ClientTLS
from protos import generation_pb2 as pb
from protos import generation_pb2_grpc, target_pb2
from router import admission, auth, secure, shutdown, telemetry, tracing
from router.admission import AdmissionLimits
from router.arguments import add_arguments, config_from_args
from router.config import RouterConfig
from router.discovery import DraftDiscovery
from router.draft_pool import DraftPool
from router.forced_steps import ForcedSteps
from router.http_server import start_http
from router.kv_manager import KVManager
from router.multi_step import capped_steps
from router.radix_cache import RadixCache
from router.request_log import RequestLog
from router.scheduler import Scheduler
from router.servicer import GenerationServicer
from router.slot_allocator import SlotAllocator
from router.speculation import Speculation
from router.target_client import TargetClient
from router.target_contract import TargetContract
from router.target_wait import claim_target, wait_for_target
from router.target_watch import TargetWatch
from router.tokenizer import Tokenizer
from router.validation import Limits

log = logging.getLogger("splitspec.router")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name


def model_info(
    info: target_pb2.TargetInfo, tokenizer: Tokenizer, config: RouterConfig
) -> pb.ModelInfo:
    return pb.ModelInfo(
        model_name=info.model_name,
        architecture=info.architecture,
        vocab_size=info.vocab_size,
        max_context_length=info.max_context_length,
        max_new_tokens_limit=config.max_new_tokens_limit,
        eos_token_ids=list(tokenizer.eos_token_ids),
        dtype=info.dtype,
        device=info.device,
        has_chat_template=tokenizer.chat_template is not None,
    )


def fit_to_target(config: RouterConfig, info: target_pb2.TargetInfo) -> RouterConfig:
    """The config with the limits the target cannot meet lowered to the target's, with a warning."""
    if config.max_step_tokens > info.max_batch_tokens:
        log.warning(
            "--max-step-tokens %d lowered to the target's max_batch_tokens %d",
            config.max_step_tokens,
            info.max_batch_tokens,
        )
        config = dataclasses.replace(config, max_step_tokens=info.max_batch_tokens)
    if info.max_tree_tokens and config.max_tree_tokens > info.max_tree_tokens:
        log.warning(
            "--max-tree-tokens %d lowered to the target's max_tree_tokens %d",
            config.max_tree_tokens,
            info.max_tree_tokens,
        )
        config = dataclasses.replace(config, max_tree_tokens=info.max_tree_tokens)
    return dataclasses.replace(config, decode_steps=capped_steps(config.decode_steps, info))


def kv_factory(config: RouterConfig) -> Callable[[int], KVManager]:
    """Builds the KV bookkeeping for a target of ``num_slots`` (again when a target comes back
    with another pool)."""
    drafts = config.draft_addresses or config.draft_dns
    lookahead = config.max_tree_tokens if drafts else 0

    def fresh_kv(num_slots: int) -> KVManager:
        allocator = SlotAllocator(num_slots)
        retract = config.kv_policy == "retract"
        return KVManager(RadixCache(allocator), config.reserve_block, lookahead, retract)

    return fresh_kv


def build_speculation(
    config: RouterConfig,
    info: target_pb2.TargetInfo,
    target: TargetClient,
    kv: KVManager,
    tls: ClientTLS | None,
) -> Speculation:
    pool = DraftPool(
        list(config.draft_addresses), config.draft_timeout_s, tls=tls,
        deadline_floor_s=config.draft_deadline_floor_s, max_tree_tokens=config.max_tree_tokens,
        target=info,
    )  # fmt: skip
    return Speculation(
        pool,
        target,
        kv,
        default_on=config.speculate_by_default,
        max_tree_tokens=config.max_tree_tokens,
        vocab_size=info.vocab_size,
        max_context=info.max_context_length,
        max_verify_tokens=info.max_batch_tokens,
        max_catch_up_per_step=config.max_catch_up_per_step,
        forced_steps=ForcedSteps.for_target(info),
    )


def public_server(
    security: secure.RouterSecurity, admit: AdmissionLimits, servicer: GenerationServicer
) -> grpc.aio.Server:
    server = grpc.aio.server(
        options=admission.public_server_options(SERVER_OPTIONS, admit),
        interceptors=auth.interceptors(security.api_key),
    )
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
    return server


async def serve(
    config: RouterConfig,
    security: secure.RouterSecurity | None = None,
    admit: AdmissionLimits | None = None,
) -> None:
    security, admit = security or secure.RouterSecurity(), admit or AdmissionLimits()
    if config.log_requests:
        telemetry.install(RequestLog())
    tokenizer = Tokenizer.from_model_path(str(config.model_path))  # a bad path fails first
    target, info = await claimed_target(config, security.internal_tls)
    spans = tracing.start(config, config.served_model_name or info.model_name)  # None: off
    try:
        await serve_with_target(config, security, admit, tokenizer, target, info)
    finally:
        await target.give_up()  # the next router need not wait for the claim to lapse
        if spans is not None:  # the spans still queued leave before the process does
            spans.stop()


async def claimed_target(
    config: RouterConfig, tls: ClientTLS | None
) -> tuple[TargetClient, target_pb2.TargetInfo]:
    """The target, once it answers and this router holds its claim, with its KV swept of
    requests an earlier router left."""
    await wait_for_target(config.target_address, config.connect_timeout_s, tls)
    name = f"{socket.gethostname()} pid {os.getpid()} port {config.port}"
    target = TargetClient(
        config.target_address, config.rpc_timeout_s, tls, name, config.target_claim_lease_s
    )
    await claim_target(target, config.connect_timeout_s)
    info = await target.info()
    await target.release_orphans("the router is starting")
    return target, info


async def serve_with_target(
    config: RouterConfig,
    security: secure.RouterSecurity,
    admit: AdmissionLimits,
    tokenizer: Tokenizer,
    target: TargetClient,
    info: target_pb2.TargetInfo,
) -> None:
    """The scheduler, the public gRPC and HTTP servers and the watchers, until the first of
    them ends (a drain, the server's end)."""
    router_decode_steps = config.decode_steps
    config = fit_to_target(config, info)
    fresh_kv = kv_factory(config)
    kv = fresh_kv(info.num_slots)
    spec = build_speculation(config, info, target, kv, security.internal_tls)
    interval = config.draft_dns_interval_s
    discoveries = [DraftDiscovery(spec.pool, name, interval) for name in config.draft_dns]
    scheduler = Scheduler(config, tokenizer, target, kv, spec)
    limits = Limits(info.vocab_size, info.max_context_length,
                    config.max_new_tokens_limit, config.default_max_new_tokens)  # fmt: skip
    servicer = GenerationServicer(
        scheduler, limits, model_info(info, tokenizer, config), admit, discoveries
    )
    server = public_server(security, admit, servicer)
    health = await add_health_and_reflection_aio(server, [SERVICE_NAME])
    contract = TargetContract(
        info, config.max_step_tokens, config.max_tree_tokens, router_decode_steps, fresh_kv
    )
    watch = TargetWatch(scheduler, target, health, [SERVICE_NAME], contract)
    address = bind_or_exit(server, f"{config.host}:{config.port}", security.public_tls, "router")
    await server.start()
    drained = shutdown.install(server, scheduler, health, [SERVICE_NAME])
    log.info("router serving on %s (target %s, %d slots)",
             address, config.target_address, info.num_slots)  # fmt: skip
    tasks = {
        asyncio.create_task(scheduler.run()),
        asyncio.create_task(spec.pool.probe_forever()),
        asyncio.create_task(watch.run()),
        asyncio.create_task(drained.wait()),  # SIGTERM: drain, then return
        asyncio.create_task(server.wait_for_termination()),
        *http_tasks(servicer, config, security, info.model_name),
        *(asyncio.create_task(d.run_forever()) for d in discoveries),
    }
    await first_to_end(tasks)


def http_tasks(
    servicer: GenerationServicer,
    config: RouterConfig,
    security: secure.RouterSecurity,
    model_name: str,
) -> set[asyncio.Task]:
    """The metrics observer, and the OpenAI-compatible HTTP server's task (none without
    --http-port)."""
    return start_http(
        servicer,
        config.host,
        config.http_port,
        config.served_model_name or model_name,
        key_checker=auth.key_checker(security.api_key),
        tls=security.public_tls,
        max_body_bytes=config.max_http_body_bytes,
    )


async def first_to_end(tasks: set[asyncio.Task]) -> None:
    """Returns when the first task ends (a drain, the server's end), re-raising its crash."""
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        task.result()


def main(argv: list[str] | None = None) -> None:
    die_with_parent_if_asked()
    parser = HintingParser(prog="splitspec router", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging("router", args.log_level, args.log_format)
    cpu_wake.apply(args.keep_cpus_awake)
    config = config_from_args(args)
    asyncio.run(serve(config, secure.security_from_args(args), admission.limits_from_args(args)))
