"""EAGLE losses over an unrolled head: feature regression plus token cross-entropy per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draft_service.eagle.head import EagleHead
from draft_service.eagle.train.unroll import unrolled_features


@dataclass
class Batch:
    """B sequences, right-padded. tokens [B, N + J + 1], features [B, N + J + 1, H]."""

    tokens: torch.Tensor
    features: torch.Tensor
    lengths: torch.Tensor  # [B]
    prompt_lens: torch.Tensor  # [B]
    width: int  # N: anchors per sequence

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


@dataclass(frozen=True)
class LossWeights:
    reg: float = 1.0  # smooth L1 on features, in units of each dimension's std
    cls: float = 0.1  # cross-entropy against the target's next-token distribution
    step_decay: float = 0.8  # step j counts decay ** (j - 1)
    soft_targets: bool = True  # target distribution (True) or the target's greedy token


@dataclass
class StepLosses:
    total: torch.Tensor
    reg: list[torch.Tensor]  # per step, detached (read them at log time: one sync)
    cls: list[torch.Tensor]
    acc: list[torch.Tensor]  # draft top-1 == target top-1
    num_rows: list[int]  # rows the cross-entropy ran over, per step

    def as_floats(self) -> dict[str, list[float]]:
        return {name: [round(float(v), 5) for v in getattr(self, name)]
                for name in ("reg", "cls", "acc")}


def valid_rows(batch: Batch, step: int) -> torch.Tensor:
    """[B, N] bool: step ``step`` at anchor a predicts feature a + step of a reply token whose
    next token exists (the drafter never predicts inside the prompt)."""
    target = torch.arange(batch.width, device=batch.tokens.device)[None, :] + step
    lengths = batch.lengths.to(target.device)[:, None]
    prompt_lens = batch.prompt_lens.to(target.device)[:, None]
    return (target >= prompt_lens) & (target <= lengths - 2)


def pick_rows(valid: torch.Tensor, count: int, generator: torch.Generator | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into valid.flatten() and their 0/1 weights: the valid rows when count is 0
    (sizes the step by a host sync: cheap on a CPU), else ``count`` rows, valid ones first in
    random order, with fixed shapes and no host sync (a GPU step never waits on how many rows
    happen to be valid)."""
    flat = valid.flatten()
    if count <= 0:
        index = flat.nonzero().squeeze(1)
    elif count >= flat.numel():
        index = torch.arange(flat.numel(), device=flat.device)
    else:
        noise = torch.rand(flat.shape, generator=generator, device=flat.device)
        index = (flat.float() + noise).topk(count).indices
    return index, flat[index].float()


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def compute_losses(head: EagleHead, batch: Batch, num_steps: int, weights: LossWeights,
                   feature_scale: torch.Tensor, noise_std: float = 0.0,
                   generator: torch.Generator | None = None, ce_rows: int = 0) -> StepLosses:
    """Regression over every valid row; cross-entropy over ``ce_rows`` of them per step (all
    when 0): the vocabulary-sized part is most of a step's cost."""
    features_in = batch.features[:, : batch.width].float()
    if noise_std > 0:
        noise = torch.randn(features_in.shape, generator=generator, device=features_in.device)
        features_in = features_in + noise * noise_std * feature_scale
    outs = unrolled_features(head, batch.tokens, features_in, num_steps)
    total = torch.zeros((), device=batch.features.device)
    result = StepLosses(total, [], [], [], [])
    norm = sum(weights.step_decay ** j for j in range(num_steps))
    for step, predicted in enumerate(outs, start=1):
        valid = valid_rows(batch, step)
        guess = predicted.flatten(0, 1)
        truth = batch.features[:, step : step + batch.width].flatten(0, 1)
        reg_rows = F.smooth_l1_loss(guess.float() / feature_scale, truth.float() / feature_scale,
                                    reduction="none").mean(-1)
        reg = _weighted_mean(reg_rows, valid.flatten().float())
        index, weight = pick_rows(valid, ce_rows, generator)
        logp = torch.log_softmax(head.logits(guess[index].float()), dim=-1)
        with torch.no_grad():
            if weights.soft_targets:
                target_p = torch.softmax(head.logits(truth[index].float()), dim=-1)
                target_top = target_p.argmax(-1)
            else:
                tokens = batch.tokens[:, step + 1 : step + 1 + batch.width].flatten()
                target_top = tokens[index]
        ce_per_row = (-(target_p * logp).sum(-1) if weights.soft_targets
                      else F.nll_loss(logp, target_top, reduction="none"))
        cls = _weighted_mean(ce_per_row, weight)
        total = total + weights.step_decay ** (step - 1) * (weights.reg * reg + weights.cls * cls)
        result.num_rows.append(int(ce_rows) or valid.numel())
        result.reg.append(reg.detach())
        result.cls.append(cls.detach())
        result.acc.append(_weighted_mean((logp.argmax(-1) == target_top).float(), weight).detach())
    result.total = total / norm
    return result
