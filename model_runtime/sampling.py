"""Batched sampling: greedy, temperature, top-k, top-p, min-p, with counter-based seeded
randomness.

Randomness is a hash of (seed, position, salt), not a stateful generator: a request's draws
do not depend on which other requests share its batch, need no per-request generator object
on the device, and can be replayed inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-row sampling parameters, all of shape [R] on the logits' device."""

    temperature: torch.Tensor  # float32; 0 means greedy
    top_p: torch.Tensor  # float32 in (0, 1]
    top_k: torch.Tensor  # int64; 0 means off
    seed: torch.Tensor  # int64
    position: torch.Tensor  # int64: context position of the token being drawn
    min_p: torch.Tensor  # float32 in [0, 1]; 0 means off
    # Known on the host: some row has top_k or top_p < 1, filters that rank the vocabulary (a
    # sort: 3.3 ms a row of the default model's 49,152 ids on a 2-core EPYC, where the softmax
    # takes 0.05). False skips the sort; the probabilities are the same either way.
    ranked: bool = True

    @property
    def all_greedy(self) -> bool:
        # Called once per step, before any device work that depends on it.
        return bool((self.temperature == 0).all())

    def per_row(self, repeats: int) -> SamplingTensors:
        """Each row's parameters ``repeats`` times in a row (a tree's nodes)."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ranked"}
        repeated = {name: t.repeat_interleave(repeats) for name, t in tensors.items()}
        return SamplingTensors(**repeated, ranked=self.ranked)


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 lanes; low 32 bits stay exact through wrap-around."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def seeded_uniform(
    seed: torch.Tensor, position: torch.Tensor, salt: torch.Tensor | int
) -> torch.Tensor:
    """Uniform floats in [0, 1), a pure function of (seed, position, salt)."""
    if isinstance(salt, int):  # a fill, not a host->device copy: capturable in a CUDA graph
        x = _hash32(torch.full_like(position, salt + 0x9E3779B9))
    else:
        x = _hash32(salt + 0x9E3779B9)
    x = _hash32(x ^ position)
    x = _hash32(x ^ (seed & _MASK32))
    x = _hash32(x ^ ((seed >> 32) & _MASK32))
    return (x >> 8).to(torch.float64).div(1 << 24).to(torch.float32)


def filtered_probs(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Target distribution after temperature, top-k, top-p and min-p. Greedy rows become one-hot.

    The three filters are one keep condition, each measured on the same temperature-scaled
    distribution (not one after another's renormalisation): a token stays when it is among the
    top_k, the mass before it is below top_p (any mass when top_p is 1), and its probability is
    at least min_p times the most likely token's (vLLM's min_p). The most likely token always
    stays."""
    temperature = params.temperature.clamp_min(1e-5)[:, None]
    probs = torch.softmax(logits / temperature, dim=-1)
    if params.ranked:
        probs = _ranked_filters(probs, params)
    else:  # min_p needs only the largest probability
        probs = probs * (probs >= params.min_p[:, None] * probs.amax(-1, keepdim=True))
    probs = probs / probs.sum(-1, keepdim=True)
    # scatter, not one_hot: one_hot checks its input's range on the host (a sync).
    greedy = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where((params.temperature == 0)[:, None], greedy, probs)


def _ranked_filters(probs: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """``probs`` with the tokens that top_k, top_p or min_p drop zeroed, through a sort. A row
    without top_k or top_p keeps the values it had, bit for bit, as in the sort-free path."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    top_k = torch.where(params.top_k > 0, params.top_k, probs.shape[-1])[:, None]
    # Keep a token while the mass before it is below top_p: the smallest set reaching top_p.
    # At top_p = 1 a rounded cumulative sum could reach 1 early: no cut there.
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    within_p = (mass_before < params.top_p[:, None]) | (params.top_p >= 1.0)[:, None]
    keep = (rank < top_k) & within_p
    keep &= sorted_probs >= params.min_p[:, None] * sorted_probs[:, :1]
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)


def sample_from_probs(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one token per row; never returns a zero-probability token."""
    cdf = probs.cumsum(-1)
    threshold = uniform[:, None] * cdf[:, -1:]
    index = (cdf <= threshold).sum(-1)
    last_nonzero = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(index, last_nonzero)


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """One token per row of fp32 logits [R, V]."""
    if params.all_greedy:
        return logits.argmax(-1)
    return sample_greedy_or_drawn(logits, params)


def sample_greedy_or_drawn(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """``sample`` without its greedy shortcut: no host sync, so a CUDA graph may hold it."""
    probs = filtered_probs(logits, params)
    drawn = sample_from_probs(probs, seeded_uniform(params.seed, params.position, 0))
    return torch.where(params.temperature == 0, logits.argmax(-1), drawn)
