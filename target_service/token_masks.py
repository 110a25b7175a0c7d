"""Structured output on the target: the router's allowed-token masks applied before sampling.

The router keeps each constrained request's grammar state and sends, with every position the
target samples or verifies, the set of tokens the grammar allows there (a bitmask:
``ForwardItem.allowed_tokens``, one per node in ``VerifyItem.allowed_tokens``). The target
sets every other token's logit to -inf before its argmax or draw, at a decode step or a tree
node, so a verified tree node is judged under exactly the mask sequential decoding would have used
there: output with speculation equals output without, and always follows the grammar.

A mask travels as little-endian 32-bit words (llguidance's layout): bit ``t % 32`` of word
``t // 32`` allows token ``t``; tokens past the mask's end are not allowed. The words are
copied to the device as they are and unpacked there.

On CUDA a masked decode step replays the decode graphs' LOGITS mode and is masked and drawn
after it (changed_logits.py); a greedy masked verify up to batch 4 replays masked verify
graphs (verify_graphs.py, MaskBuffers below); multi-step decoding never takes masks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from target_service.errors import InvalidStep

_BITS = 32


def words_for(vocab: int) -> int:
    """The longest mask a vocabulary of ``vocab`` tokens takes, in 32-bit words."""
    return (vocab + _BITS - 1) // _BITS


def check_mask(request_id: str, mask: bytes, vocab: int, nodes: int = 1) -> None:
    """``nodes`` masks of one length, each at most ``words_for(vocab)`` whole words."""
    if not mask:
        return
    per_node, rest = divmod(len(mask), nodes)
    if rest or per_node % 4 or not 0 < per_node <= 4 * words_for(vocab):
        raise InvalidStep(
            f"request {request_id!r}: allowed_tokens needs {nodes} mask(s) of equal length, each "
            f"a whole number of 32-bit words, at most {4 * words_for(vocab)} bytes; got "
            f"{len(mask)} bytes"
        )


def any_masked(masks: Sequence[bytes]) -> bool:
    return any(masks)


def allowed(masks: Sequence[bytes], vocab: int, device: torch.device) -> torch.Tensor:
    """``[R, vocab]`` bool: row r allows what ``masks[r]`` does; an empty mask allows all."""
    host = np.empty((len(masks), words_for(vocab)), dtype=np.int32)
    fill_words(host, masks)
    return keep_from_words(torch.from_numpy(host).to(device), vocab)


def fill_words(out: np.ndarray, masks: Sequence[bytes]) -> None:
    """Rows of 32-bit words ``[R, W]``: row r is ``masks[r]``, zero past its end (not allowed),
    or every bit set where the mask is empty (no constraint)."""
    out.fill(-1)
    for row, mask in enumerate(masks):
        if mask:
            words = np.frombuffer(mask, dtype="<i4")
            out[row, : words.size] = words
            out[row, words.size :] = 0


def keep_from_words(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[R, vocab]`` bool from words ``[R, W]`` on the device (no host sync: graphs hold it)."""
    shifts = torch.arange(_BITS, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [R, W, 32], bit 0 first (little-endian)
    return bits.reshape(words.shape[0], words.shape[1] * _BITS)[:, :vocab].bool()


def node_masks(masks: Sequence[bytes], sizes: Sequence[int], nodes: int) -> list[bytes]:
    """Per-node masks of trees padded to ``nodes`` nodes, tree-major: ``masks[b]`` split into
    its ``sizes[b]`` nodes' masks; empty (no constraint) for padding and unmasked trees."""
    rows = [b"" for _ in range(len(masks) * nodes)]
    for b, (mask, size) in enumerate(zip(masks, sizes, strict=True)):
        per_node = len(mask) // size
        for i in range(size if mask else 0):
            rows[b * nodes + i] = mask[i * per_node : (i + 1) * per_node]
    return rows


def restrict(logits: torch.Tensor, masks: Sequence[bytes]) -> torch.Tensor:
    """Logits ``[R, V]`` with each row's disallowed tokens at -inf (unchanged without masks)."""
    if not any_masked(masks):
        return logits
    keep = allowed(masks, logits.shape[-1], logits.device)
    return logits.masked_fill(~keep, float("-inf"))


def restrict_tree(
    logits: torch.Tensor, masks: Sequence[bytes], sizes: Sequence[int]
) -> torch.Tensor:
    """Logits ``[B, N, V]`` after each tree node; ``masks[b]`` holds the masks of request b's
    ``sizes[b]`` nodes, node by node (empty: no constraint). Padding nodes keep every token."""
    if not any_masked(masks):
        return logits
    batch, nodes, vocab = logits.shape
    keep = allowed(node_masks(masks, sizes, nodes), vocab, logits.device)
    keep = keep.view(batch, nodes, vocab)
    return logits.masked_fill(~keep, float("-inf"))


class MaskBuffers:
    """The masked verify graphs' static input (verify_graphs.py): rows of mask words
    ``[b * n, W]`` per bucket (node i of tree t is row t * n + i; padding rows allow
    everything), through a pinned host twin."""

    def __init__(self, vocab: int, max_rows: int, device: torch.device) -> None:
        self.vocab = vocab
        shape = (max_rows, words_for(vocab))
        self.words = torch.full(shape, -1, dtype=torch.int32, device=device)
        self.host = torch.zeros(shape, dtype=torch.int32, pin_memory=device.type == "cuda")

    def load(self, masks: list[bytes], sizes: list[int], batch: int, nodes: int) -> None:
        padded, sizes = masks + [b""] * (batch - len(masks)), sizes + [1] * (batch - len(sizes))
        rows = batch * nodes
        fill_words(self.host[:rows].numpy(), node_masks(padded, sizes, nodes))
        self.words[:rows].copy_(self.host[:rows], non_blocking=True)

    def keep(self, rows: int) -> torch.Tensor:
        return keep_from_words(self.words[:rows], self.vocab)
