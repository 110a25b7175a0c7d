"""A request's share of a target-only step as the target's ForwardItem."""

from __future__ import annotations

from protos import target_pb2
from router.kv_manager import KVManager
from router.prompt_scores import scored_ids
from router.request import Request


def forward_item(
    kv: KVManager, req: Request, num_tokens: int, sample: bool, masked: bool = True
) -> target_pb2.ForwardItem:
    """The next ``num_tokens`` context tokens, the slots the target has not seen yet, and on a
    request's first step its sampling parameters (the target keeps them from then on).
    ``masked``: a structured-output request's draw gets its format's mask (not in a burst:
    router/grammar_bursts.py)."""
    start = req.num_computed
    kv.ensure_slots(req, start + num_tokens)
    item = target_pb2.ForwardItem(
        request_id=req.request_id,
        token_ids=req.context_ids[start : start + num_tokens],
        start_pos=start,
        new_slots=req.slots[req.num_sent_slots :],
        sample=sample,
        scored_ids=scored_ids(req, start, num_tokens),  # the prompt's scores, where asked
    )
    if sample and masked and req.constraint is not None:  # what the format allows
        item.allowed_tokens = req.constraint.mask()
    if req.num_sent_slots == 0:
        item.sampling.CopyFrom(sampling_config(req))
    req.num_sent_slots = len(req.slots)
    return item


def sampling_config(req: Request) -> target_pb2.SamplingConfig:
    """The request's sampling parameters as the target opens it. A re-opening (after a
    retraction or a rebuilt table) states what the target's fresh state needs to go on
    exactly: the whole context so far for repetition_penalty, the tokens min_tokens still owes."""
    o = req.options
    config = target_pb2.SamplingConfig(
        temperature=o.temperature, top_p=o.top_p, top_k=o.top_k, seed=o.seed,
        presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty,
        logprobs=o.logprobs, top_logprobs=o.top_logprobs, logit_bias=dict(o.logit_bias),
        min_p=o.min_p, repetition_penalty=o.repetition_penalty,
    )  # fmt: skip
    if o.repetition_penalty != 1.0:
        config.repetition_context.extend(req.context_ids)
    if req.min_tokens_binds:
        config.min_tokens = o.min_tokens - len(req.output_ids)
        config.min_tokens_banned_ids.extend(o.min_tokens_banned_ids)
    return config
