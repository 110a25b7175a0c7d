"""Structured output on the target: the router's allowed-token masks applied before sampling.

The router keeps each constrained request's grammar state and sends, with every position the
target samples or verifies, the set of tokens the grammar allows there (a bitmask:
``ForwardItem.allowed_tokens``, one per node in ``VerifyItem.allowed_tokens``). The target
sets every other token's logit to -inf before greedy choice, sampling or rejection sampling,
so a verified tree node is judged under exactly the mask sequential decoding would have used
there: output with speculation equals output without, and always follows the grammar.

A mask travels as little-endian 32-bit words (llguidance's layout): bit ``t % 32`` of word
``t // 32`` allows token ``t``; tokens past the mask's end are not allowed. The words are
copied to the device as they are and unpacked there.

The CUDA graphs and multi-step decoding apply no masks: a masked request takes the eager step.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    width = words_for(vocab)
    host = torch.full((len(masks), width), -1, dtype=torch.int32)  # all bits set: no mask
    for row, mask in enumerate(masks):
        if mask:
            words = torch.frombuffer(bytearray(mask), dtype=torch.int32)
            host[row, : words.numel()] = words
            host[row, words.numel() :] = 0  # past the mask's end: not allowed
    words = host.to(device, non_blocking=False)
    shifts = torch.arange(_BITS, dtype=torch.int32, device=device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [R, width, 32], bit 0 first (little-endian)
    return bits.reshape(len(masks), width * _BITS)[:, :vocab].bool()


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
    rows = [b"" for _ in range(batch * nodes)]
    for b, (mask, size) in enumerate(zip(masks, sizes, strict=True)):
        per_node = len(mask) // size
        for i in range(size if mask else 0):
            rows[b * nodes + i] = mask[i * per_node : (i + 1) * per_node]
    keep = allowed(rows, vocab, logits.device).view(batch, nodes, vocab)
    return logits.masked_fill(~keep, float("-inf"))
