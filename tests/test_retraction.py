"""The retraction policy (router/retraction.py) in the real scheduler, against a stand-in target
that keeps what the real one keeps: a slot table per request, and per slot the token written
there (its "KV"). Its next token is a hash of the context read back through the table, so a
slot freed while still in use, a wrong table after a rebuild or a recompute at the wrong
positions all change the output. Many pool sizes and workloads, in well under a second each;
tests/test_e2e_kv_pressure.py runs the same policy on the real stack.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from protos import target_pb2
from router.config import RouterConfig
from router.draft_pool import DraftPool
from router.kv_manager import KVManager
from router.radix_cache import RadixCache
from router.request import Request, SamplingOptions
from router.scheduler import Scheduler
from router.slot_allocator import SlotAllocator
from router.speculation import Speculation
from tests.helpers.prompts import model_dir, router_tokenizer


def next_token(context: list[int]) -> int:
    return sum((i + 1) * t for i, t in enumerate(context)) * 2654435761 % 1000 + 10


class SlotTarget:
    """Forward and Release with the target's table semantics (target_service/engine.py)."""

    def __init__(self, num_slots: int) -> None:
        self.written: list[int | None] = [None] * num_slots
        self.tables: dict[str, list[int]] = {}
        self.penalised: set[str] = set()
        self.multi_step_forwards = 0

    async def forward(
        self, items: list[target_pb2.ForwardItem], decode_steps: int = 1
    ) -> target_pb2.ForwardResponse:
        """``decode_steps`` K > 1: K decode steps, each feeding its token to the next."""
        sampled = []
        self.multi_step_forwards += decode_steps > 1
        for it in items:
            if it.request_id not in self.tables:
                assert it.HasField("sampling"), "a new table came without its sampling config"
                if it.sampling.presence_penalty:
                    self.penalised.add(it.request_id)
            table = self.tables.setdefault(it.request_id, [])
            table += it.new_slots
            if decode_steps > 1:
                assert len(it.token_ids) == 1 and it.sample, "K steps need one decode token"
                assert it.request_id not in self.penalised, "penalties need one step"
            tokens = list(it.token_ids)
            for _ in range(decode_steps):
                end = it.start_pos + len(tokens)
                assert end <= len(table), f"{it.request_id}: positions to {end}, {len(table)} slots"
                for pos in range(it.start_pos, end):
                    self.written[table[pos]] = tokens[pos - it.start_pos]
                if it.sample:
                    tokens.append(next_token([self.written[table[p]] for p in range(end)]))
                    sampled.append(tokens[-1])
        await asyncio.sleep(0)  # let streams and submissions interleave, as over gRPC
        return target_pb2.ForwardResponse(next_token_ids=sampled)

    async def verify(self, items: list) -> None:
        raise AssertionError("no draft replica: nothing to verify")

    async def release(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.tables.pop(rid, None)


def expected(prompt: list[int], max_new: int) -> list[int]:
    context = list(prompt)
    for _ in range(max_new):
        context.append(next_token(context))
    return context[len(prompt) :]


async def collect(req: Request) -> list[int]:
    tokens: list[int] = []
    while True:
        item = await asyncio.wait_for(req.outbox.get(), 10)
        tokens += item.token_ids
        if item.finish_reason:
            return tokens


async def run_workload(
    num_slots: int, requests: list[Request], decode_steps: int = 1
) -> tuple[Scheduler, list]:
    config = RouterConfig(model_path=model_dir(), target_address="-", max_step_tokens=64,
                          decode_steps=decode_steps)  # fmt: skip
    target = SlotTarget(num_slots)
    kv = KVManager(RadixCache(SlotAllocator(num_slots)), config.reserve_block, retract=True)
    spec = Speculation(DraftPool([], 1.0), target, kv, default_on=False, max_tree_tokens=8,  # type: ignore[arg-type]
                       vocab_size=49152, max_context=4096, max_verify_tokens=512)  # fmt: skip
    scheduler = Scheduler(config, router_tokenizer(), target, kv, spec)  # type: ignore[arg-type]
    loop = asyncio.create_task(scheduler.run())
    try:
        for req in requests:
            scheduler.submit(req)
        outputs = await asyncio.gather(*(collect(r) for r in requests))
    finally:
        loop.cancel()
    assert not target.tables, "a finished request's table was left on the target"
    assert (target.multi_step_forwards > 0) == (decode_steps > 1)
    return scheduler, outputs


def workload(seed: int, count: int, max_new: int, penalty_every: int = 0) -> list[Request]:
    rnd = random.Random(seed)
    shared = [rnd.randrange(10, 1000) for _ in range(rnd.randrange(0, 30))]  # a common prefix
    requests = []
    for i in range(count):
        prompt = shared + [rnd.randrange(10, 1000) for _ in range(rnd.randrange(5, 50))]
        penalty = 0.5 if penalty_every and i % penalty_every == 0 else 0.0
        options = SamplingOptions(max_new_tokens=max_new, temperature=0.0, ignore_eos=True,
                                  presence_penalty=penalty)  # fmt: skip
        requests.append(Request(f"r{i}", prompt, options))
    return requests


@pytest.mark.parametrize("decode_steps", [1, 4])  # 4: multi-step decoding (router/multi_step.py)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_slots", [144, 200, 400])  # a request needs up to 137
def test_retracted_requests_finish_with_their_output_and_give_every_slot_back(
    seed: int, num_slots: int, decode_steps: int
) -> None:
    requests = workload(seed, count=10, max_new=60)
    scheduler, outputs = asyncio.run(run_workload(num_slots, requests, decode_steps))
    for req, tokens in zip(requests, outputs, strict=True):
        assert tokens == expected(req.prompt_ids, 60), f"{req.request_id} changed"
    assert scheduler.counters.num_retractions > 0
    kv = scheduler.kv
    assert kv.outstanding == 0 and kv.num_retractable == 0
    kv.cache.check_integrity(outside_slots=[])  # free + cached == every slot
    assert kv.cache.num_locked_tokens == 0


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_requests_with_penalties_hold_their_reservation_and_are_never_retracted(
    decode_steps: int,
) -> None:
    requests = workload(7, count=10, max_new=60, penalty_every=3)
    scheduler, outputs = asyncio.run(run_workload(200, requests, decode_steps))
    for req, tokens in zip(requests, outputs, strict=True):
        assert tokens == expected(req.prompt_ids, 60), f"{req.request_id} changed"
    assert scheduler.counters.num_retractions > 0
    penalised = [r for r in requests if r.options.presence_penalty]
    assert penalised and all(r.reserved and r.num_retractions == 0 for r in penalised)
    assert any(r.num_retractions for r in requests if not r.options.presence_penalty)
