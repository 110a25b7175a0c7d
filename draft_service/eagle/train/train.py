"""The training loop: AdamW, warmup + cosine, clipping, bf16 autocast on GPU, resumable.

A checkpoint (``checkpoint.pt``: head weights, optimizer, step, data-order position and RNG
states) is written every ``checkpoint_every`` steps and when a time limit stops the run, so
``resume`` continues the same run step for step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from draft_service.eagle.head import EagleHead
from draft_service.eagle.train.batches import BatchOrder, feature_scale, make_batch
from draft_service.eagle.train.collect import FeatureSet
from draft_service.eagle.train.losses import LossWeights, compute_losses

log = logging.getLogger("splitspec.train")
CHECKPOINT = "checkpoint.pt"
Evaluator = Callable[[EagleHead], dict[str, Any]]


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 8  # sequences per step
    max_seq_len: int = 1024  # longer sequences are cut (their tail is dropped)
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    num_unroll: int = 3  # draft steps trained per anchor (training-time test)
    ce_rows: int = 0  # rows per step the cross-entropy runs over (0: every row of the batch)
    width_multiple: int = 64  # batch widths are padded to this (few shapes: allocator reuse)
    weights: LossWeights = field(default_factory=LossWeights)
    noise_std: float = 0.0  # Gaussian noise on input features, in units of each dim's std
    fc_identity_init: bool = True  # fc passes h_t through at the start (predict h_{t+1} ~ h_t)
    seed: int = 0
    checkpoint_every: int = 500
    eval_every: int = 0  # 0: evaluate at the end only (and at eval_at)
    eval_at: tuple[int, ...] = ()  # extra steps to evaluate at
    log_every: int = 20
    time_limit_s: float = 0.0  # stop (and checkpoint) once a run has trained this long; 0: none
    fit_steps_to_time: bool = False  # shrink the schedule after calibration to end in time
    stop_at_step: int = 0  # stop early at this step, schedule unchanged (for comparisons); 0: off
    amp: bool = True  # bf16 autocast on CUDA
    snapshot_at: tuple[int, ...] = ()  # steps whose weights are kept (acceptance vs. steps)


def init_head(head: EagleHead, config: TrainConfig) -> None:
    head.init_trainable(config.seed)
    if config.fc_identity_init:
        hidden = head.hidden_size
        with torch.no_grad():
            head.fc.weight[:, hidden:].copy_(torch.eye(hidden))


def lr_factor(step: int, config: TrainConfig, total: int) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, total - config.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine


class Trainer:
    def __init__(self, head: EagleHead, data: FeatureSet, config: TrainConfig, out_dir: Path,
                 device: torch.device, evaluator: Evaluator | None = None) -> None:
        self.head, self.data, self.config, self.out_dir = head, data, config, out_dir
        self.device, self.evaluator = device, evaluator
        params = [p for n, p in head.named_parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95),
                                           weight_decay=config.weight_decay)
        self.order = BatchOrder(data.lengths().tolist(), config.batch_size, config.seed)
        self.scale = feature_scale(data, config.seed).to(device)
        self.noise = torch.Generator(device=device).manual_seed(config.seed)
        self.step, self.total_steps, self.train_s = 0, config.steps, 0.0
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []

    # ---- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        path = self.out_dir / CHECKPOINT
        self.out_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "head": self.head.trainable_state_dict(), "optimizer": self.optimizer.state_dict(),
            "step": self.step, "total_steps": self.total_steps, "config_steps": self.config.steps,
            "train_s": self.train_s,
            "order": self.order.state(), "scale": self.scale.cpu(),
            "noise_rng": self.noise.get_state(), "torch_rng": torch.get_rng_state(),
            "history": self.history, "evals": self.evals,
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        tmp.replace(path)  # atomic: a killed run keeps the previous checkpoint
        return path

    def save_snapshot(self) -> Path:
        """The trainable weights now, as OUT/checkpoints/head-STEP.safetensors (bf16: a curve
        point, small enough to bring back from a GPU box)."""
        from safetensors.torch import save_file

        path = self.out_dir / f"head-{self.step:05d}.safetensors"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().to(torch.bfloat16).contiguous().cpu()
                   for k, v in self.head.trainable_state_dict().items()}, path)
        return path

    def load_checkpoint(self) -> bool:
        path = self.out_dir / CHECKPOINT
        if not path.exists():
            return False
        # weights_only: tensors, numbers and containers only (no pickle code runs on load).
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.head.load_state_dict(state["head"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        # A schedule fitted to a time limit stays; a new --steps on the command line wins.
        same = state["config_steps"] == self.config.steps
        self.total_steps = state["total_steps"] if same else self.config.steps
        self.train_s = state["train_s"]
        self.order.restore(state["order"])
        self.scale = state["scale"].to(self.device)
        self.noise.set_state(state["noise_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.history, self.evals = state["history"], state["evals"]
        return True

    # ---- the loop --------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(self.step, config, self.total_steps)
        batch = make_batch(self.data, self.order.next(), config.num_unroll, config.max_seq_len,
                           self.device, config.width_multiple)
        amp = config.amp and self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=amp):
            losses = compute_losses(self.head, batch, config.num_unroll, config.weights,
                                    self.scale, config.noise_std, self.noise, config.ce_rows)
        self.optimizer.zero_grad(set_to_none=True)
        losses.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.head.parameters(), config.grad_clip)
        self.optimizer.step()
        self.step += 1
        return {"loss": losses.total.detach(), "grad_norm": grad_norm.detach(),
                "parts": losses, "tokens": batch.num_tokens}

    def run(self, progress: bool = True) -> None:
        from tqdm import tqdm

        config = self.config
        self.head.train()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not progress)
        session = time.perf_counter()  # the time limit counts this session only
        started, window = session - self.train_s, []
        first_step, marks = self.step, dict[int, float]()
        while self.step < self.total_steps:
            window.append(self.train_step())
            now = time.perf_counter()
            self.train_s = now - started
            if config.fit_steps_to_time and config.time_limit_s:
                self._fit_schedule(first_step, marks, now - session)
                bar.total = self.total_steps
            if self.step % config.log_every == 0 or self.step == self.total_steps:
                self._log(window, bar)
                window = []
            self._scheduled_saves()
            bar.update(1)
            if config.time_limit_s and time.perf_counter() - session >= config.time_limit_s:
                break
            if self.step == config.stop_at_step:
                break
        bar.close()
        if window:
            self.history.append(self._summary(window))
        self.save_checkpoint()
        self.head.eval()

    def _log(self, window: list[dict[str, Any]], bar: Any) -> None:
        """The window's summary into the history, the progress bar and the log."""
        self.history.append(self._summary(window))
        last = self.history[-1]
        bar.set_postfix(loss=last["loss"], acc=last["acc"][0])
        log.info("step %d/%d loss %.4f acc %s cls %s (%.0f s)", self.step,
                 self.total_steps, last["loss"], last["acc"], last["cls"], self.train_s)

    def _scheduled_saves(self) -> None:
        """The evaluations, checkpoints and snapshots the config asks for at this step."""
        config = self.config
        if (config.eval_every and self.step % config.eval_every == 0) or (
                self.step in config.eval_at and self.step < self.total_steps):
            self._evaluate()
        if self.step % config.checkpoint_every == 0:
            self.save_checkpoint()
        if self.step in config.snapshot_at:
            self.save_snapshot()

    def _fit_schedule(self, first_step: int, marks: dict[int, float], elapsed: float) -> None:
        """Once, 150 steps in: shrink the schedule so that it ends inside the time limit. Steps
        50..150 are timed: the first ones run several times slower (allocator and kernel
        warm-up), and timing them ended an H200 run at a third of its time limit. 10% of the
        limit is kept for evaluations."""
        done = self.step - first_step
        if done in (50, 150):
            marks[done] = elapsed
        if done != 150:
            return
        per_step = (marks[150] - marks[50]) / 100
        fit = self.step + int((0.9 * self.config.time_limit_s - elapsed) / per_step)
        self.total_steps = max(self.step + 1, min(self.total_steps, fit))

    def _summary(self, window: list[dict[str, Any]]) -> dict[str, Any]:
        parts = [w["parts"].as_floats() for w in window]
        mean = lambda xs: round(sum(xs) / len(xs), 5)  # noqa: E731
        per_step = {k: [mean([p[k][j] for p in parts]) for j in range(len(parts[0][k]))]
                    for k in parts[0]}
        return {"step": self.step, "loss": mean([float(w["loss"]) for w in window]),
                "grad_norm": mean([float(w["grad_norm"]) for w in window]),
                "tokens": sum(w["tokens"] for w in window), "train_s": round(self.train_s, 1),
                "lr": self.optimizer.param_groups[0]["lr"], **per_step}

    def _evaluate(self) -> None:
        if self.evaluator is None:
            return
        self.head.eval()
        result = self.evaluator(self.head)
        self.evals.append({"step": self.step, **result})
        log.info("eval at step %d: %s", self.step, {
            name: {shape: r["mean_acceptance_length"] for shape, r in by_shape.items()}
            for name, by_shape in result.items()})
        self.head.train()

    def evaluate_now(self) -> dict[str, Any] | None:
        self._evaluate()
        return self.evals[-1] if self.evals else None

    def report(self) -> dict[str, Any]:
        first, last = self.history[:3], self.history[-3:]
        avg = lambda xs: round(sum(h["loss"] for h in xs) / max(1, len(xs)), 5)  # noqa: E731
        return {"config": _jsonable(asdict(self.config)), "steps": self.step,
                "total_steps": self.total_steps, "train_s": round(self.train_s, 1),
                "loss_first": avg(first), "loss_last": avg(last),
                "history": self.history, "evals": self.evals}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
