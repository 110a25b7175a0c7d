"""What a training step reads: length-bucketed batches of sequences in a seeded order that a
checkpoint can resume, cut to fixed widths, and the features' per-dimension scale."""

from __future__ import annotations

import random

import torch

from draft_service.eagle.train.collect import FeatureSet
from draft_service.eagle.train.losses import Batch


def feature_scale(data: FeatureSet, seed: int, num_rows: int = 200_000) -> torch.Tensor:
    """Per-dimension std of the target's features (floored), for regression and noise."""
    generator = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, data.num_tokens, (min(num_rows, data.num_tokens),), generator=generator)
    std = data.features[pick.to(data.features.device)].float().std(0)
    return std.clamp(min=0.1 * float(std.median()))


class BatchOrder:
    """Length-bucketed batches of sequence indices; a fresh shuffle per epoch, from the seed."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int) -> None:
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.epoch, self.index = 0, 0
        self._batches = self._make(0)

    def _make(self, epoch: int) -> list[list[int]]:
        rng = random.Random(self.seed * 1_000_003 + epoch)
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        chunk = self.batch_size * 32
        batches = []
        for start in range(0, len(order), chunk):
            part = sorted(order[start : start + chunk], key=lambda i: self.lengths[i])
            batches += [part[i : i + self.batch_size] for i in range(0, len(part), self.batch_size)]
        rng.shuffle(batches)
        return batches

    def next(self) -> list[int]:
        if self.index == len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self._make(self.epoch)
        self.index += 1
        return self._batches[self.index - 1]

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._batches = self._make(self.epoch)


def make_batch(data: FeatureSet, indices: list[int], num_steps: int, max_seq_len: int,
               device: torch.device, width_multiple: int = 1) -> Batch:
    lengths = data.lengths()[indices].clamp(max=max_seq_len)
    width = -(-int(lengths.max()) // width_multiple) * width_multiple
    span = torch.arange(width + num_steps + 1)  # + 1: the hard target of the last step
    starts = data.offsets[indices]
    rows = starts[:, None] + span[None, :]
    in_seq = span[None, :] < lengths[:, None]
    rows = torch.where(in_seq, rows, starts[:, None]).to(data.tokens.device)
    in_seq = in_seq.to(data.tokens.device)
    tokens = torch.where(in_seq, data.tokens[rows], 0)
    features = data.features[rows] * in_seq[..., None]
    return Batch(tokens.to(device), features.to(device), lengths, data.prompt_lens[indices], width)
