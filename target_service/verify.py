"""One verify pass over a batch of draft trees: forward, accept, compact, read back.

Everything between the host->device copy of the trees and the final device->host copy of the
results stays on the device: tree masks and positions come from the parent indices, and the
accepted path's KV and hidden rows move into the committed positions in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kernels import tree_ops
from kernels.tree_reference import TreeMask
from model_runtime import fused
from model_runtime.attention import AttentionMetadata, build_metadata
from model_runtime.llama import LlamaForCausalLM
from model_runtime.paged import PagedMetadata, for_trees
from model_runtime.pools import SlotPools
from model_runtime.sampling import SamplingTensors, sample_greedy_or_drawn
from target_service.logprob_pass import (
    TokenLogprobs,
    Tops,
    committed_tokens,
    logits_pass,
    read_back,
    widest,
)
from target_service.tree import Acceptance, TreeLayout, greedy_accept


@dataclass
class TreeBatch:
    """Padded trees on the device: B requests, N nodes each (padding invalid)."""

    tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]; padding has parent 0
    valid: torch.Tensor  # [B, N]
    rows: torch.Tensor  # [B] slot-table rows
    start_pos: torch.Tensor  # [B] position of each root
    num_nodes: torch.Tensor  # [B]
    all_full: bool = False  # known on the host: every tree has N nodes (no padding)


@dataclass
class VerifyOutput:
    """Host-side results, one entry per tree."""

    token_ids: list[list[int]]  # accepted drafts then the bonus token
    num_accepted: list[int]
    # [B, R, H] on the host, row j of tree b is position start + j; R covers rows 0 ..
    # num_accepted of every tree that asked for them (run_verify: R = N)
    hidden: torch.Tensor | None
    # Per tree, where the step computed them itself (verify_graphs.py; else the engine reads
    # them after the step): None for a tree whose request did not ask.
    logprobs: list[TokenLogprobs | None] | None = None


def run_verify(
    model: LlamaForCausalLM,
    pools: SlotPools,
    slot_table: torch.Tensor,
    trees: TreeBatch,
    params: SamplingTensors,
    greedy: torch.Tensor,
    want_hidden: bool,
    penalize: Callable[[torch.Tensor, TreeLayout], torch.Tensor] | None = None,
    paged: bool = False,
    logprobs: tuple[Tops, int] | None = None,
) -> VerifyOutput:
    """``logprobs``: each tree's ask and the path nodes to cover (logprobs.rows_needed), where
    a request asked: computed from this pass's own logits, before the read-back's sync."""
    mask = tree_ops.tree_mask_and_positions(trees.parents, trees.valid, trees.start_pos)
    layout, positions = mask.layout(), mask.positions
    num_nodes = trees.tokens.shape[1]
    node_ids = torch.arange(num_nodes, device=trees.tokens.device)
    node_slots = slot_table[trees.rows[:, None], trees.start_pos[:, None] + node_ids]  # [B, N]
    real = trees.valid.flatten()
    meta = _tree_metadata(slot_table, trees, node_slots, mask, real, paged)
    write_slots = meta.write_slots
    hidden = model(
        trees.tokens.flatten()[real], positions.flatten()[real], (pools.k, pools.v), meta
    )
    pools.hidden.index_copy_(0, write_slots, hidden)
    logits = _node_logits(model, hidden, trees, real)
    raw = logits  # what logprobs report: before penalties
    if penalize is not None:  # penalties, bans and biases per node (target_service.penalties)
        logits = penalize(logits, layout)
    accepted = _accept(trees, layout, positions, logits, params, greedy)
    fused.compact_accepted(pools.all_pools(), node_slots, accepted.path, pools.dummy_slot)
    rows = pools.hidden[node_slots] if want_hidden else None
    packed = _path_logprobs(trees, raw, accepted, *logprobs) if logprobs else None
    out = _read_back(trees, accepted, rows)
    tops = logprobs[0] if logprobs else None
    out.logprobs = read_back(packed, tops, [n + 1 for n in out.num_accepted])
    return out


def _node_logits(
    model: LlamaForCausalLM, hidden: torch.Tensor, trees: TreeBatch, real: torch.Tensor
) -> torch.Tensor:
    """[B, N, vocab] logits of every tree node; padding nodes (no hidden row) get zeros."""
    num_req, num_nodes = trees.tokens.shape
    if trees.all_full:  # the common case (one tree, or trees of one size): no scatter needed
        logits = model.logits(hidden)
    else:
        vocab = model.config.vocab_size
        logits = hidden.new_zeros((num_req * num_nodes, vocab), dtype=torch.float32)
        logits[real] = model.logits(hidden)
    return logits.view(num_req, num_nodes, -1)


def _path_logprobs(
    trees: TreeBatch, logits: torch.Tensor, accepted: Acceptance, tops: Tops, rows: int
) -> torch.Tensor:
    """The pass over the logits of each tree's first ``rows`` path nodes, on the device."""
    path = accepted.path[:, :rows].clamp(min=0)  # -1 past the accepted count: junk, dropped
    vocab = logits.shape[-1]
    path_logits = logits.gather(1, path[:, :, None].expand(-1, -1, vocab)).reshape(-1, vocab)
    path_tokens = trees.tokens.gather(1, accepted.path.clamp(min=0))
    tokens = committed_tokens(path_tokens, accepted.num_accepted, accepted.next_token, rows)
    return logits_pass(path_logits, tokens.reshape(-1), widest(tops))


def _tree_metadata(
    slot_table: torch.Tensor,
    trees: TreeBatch,
    node_slots: torch.Tensor,
    mask: TreeMask,
    real: torch.Tensor,
    paged: bool,
) -> AttentionMetadata | PagedMetadata:
    if paged:
        return for_trees(
            slot_table, trees.rows, trees.start_pos, node_slots, mask.ancestors, mask.depths, real
        )
    key_len = int((trees.start_pos + trees.num_nodes).max())  # a host sync: torch backend only
    return build_metadata(
        node_slots.flatten()[real],
        slot_table[trees.rows, :key_len],
        trees.start_pos,
        trees.num_nodes,
        trees.tokens.shape[1],
        new_token_mask=mask.ancestors,
    )


def _accept(
    trees: TreeBatch,
    layout: TreeLayout,
    positions: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingTensors,
    greedy: torch.Tensor,
) -> Acceptance:
    """The longest path whose every token is what the target itself picks after its parent.

    A greedy request's pick is the argmax; a sampled request's is the very draw target-only
    decoding makes at that position (model_runtime/sampling.py: keyed by seed and position),
    so a sampled request emits the tokens it would emit without speculation, token for token,
    whatever steps speculated. In law this is the multi-draft rejection rule with point-mass
    drafts: child c is taken with probability q(c), the first child whose token was drawn."""
    if bool(greedy.all()):  # known on the host already: no device sync
        target_next = fused.greedy_ids(logits)
    else:  # the draw takes the argmax of a greedy (temperature 0) request's rows itself
        target_next = _node_draws(logits, params, positions + 1)
    return _greedy(trees, target_next, layout)


def _node_draws(
    logits: torch.Tensor, params: SamplingTensors, draw_positions: torch.Tensor
) -> torch.Tensor:
    """``[B, N]``: each request's draw after each node, keyed at ``draw_positions`` (the token
    after node i sits at the node's own position + 1), from its filtered distribution."""
    num_req, num_nodes, vocab = logits.shape
    per_node = replace(params.per_row(num_nodes), position=draw_positions.flatten())
    return sample_greedy_or_drawn(logits.view(-1, vocab), per_node).view(num_req, num_nodes)


def _greedy(trees: TreeBatch, target_next: torch.Tensor, layout) -> Acceptance:
    if target_next.is_cuda:  # one Triton launch (tree_ops); it builds what it needs itself
        return tree_ops.greedy_accept_path(trees.tokens, trees.parents, trees.valid, target_next)
    return greedy_accept(trees.tokens, trees.parents, trees.valid, target_next, layout)


def _read_back(
    trees: TreeBatch, accepted: Acceptance, hidden_rows: torch.Tensor | None
) -> VerifyOutput:
    path_tokens = trees.tokens.gather(1, accepted.path.clamp(min=0))
    packed = torch.cat(
        [path_tokens, accepted.num_accepted[:, None], accepted.next_token[:, None]], 1
    )
    rows = packed.tolist()  # the pass's one device->host sync for ids (hidden rows follow)
    hidden = hidden_rows.to("cpu") if hidden_rows is not None else None
    token_ids = [row[1 : 1 + row[-2]] + [row[-1]] for row in rows]
    return VerifyOutput(token_ids, [row[-2] for row in rows], hidden)
