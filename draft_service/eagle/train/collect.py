"""Training data for a draft head: token sequences and the target's features for them.

Features come from the target's own ``LlamaForCausalLM.forward`` (the function the target
service runs before it stores rows in its hidden pool), over whole prompt + reply sequences
laid out in contiguous slots, so the head trains on the rows the service will send it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from draft_service.eagle.train.data import PromptSet
from draft_service.eagle.train.generate import GreedyGenerator, generate_all
from model_runtime.attention import build_metadata
from model_runtime.llama import LlamaForCausalLM

MANIFEST = "manifest.json"


@dataclass
class FeatureSet:
    """Sequences concatenated: sequence i is rows offsets[i]:offsets[i+1]."""

    tokens: torch.Tensor  # [T] int64
    features: torch.Tensor  # [T, H]: target feature of each token (pre-norm, last layer)
    offsets: torch.Tensor  # [S + 1] int64
    prompt_lens: torch.Tensor  # [S] int64
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def reply_token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id occurs in the replies (prompt rows excluded): [V] int64,
        for choosing the draft's reduced vocabulary."""
        lengths = self.lengths()
        position = torch.arange(self.num_tokens) - torch.repeat_interleave(self.offsets[:-1],
                                                                            lengths)
        is_reply = position >= torch.repeat_interleave(self.prompt_lens, lengths)
        reply_tokens = self.tokens[is_reply.to(self.tokens.device)]
        return torch.bincount(reply_tokens.cpu(), minlength=vocab_size).long()

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[start:end], self.features[start:end], int(self.prompt_lens[i])

    def to(self, device: torch.device | str) -> FeatureSet:
        return FeatureSet(self.tokens.to(device), self.features.to(device), self.offsets,
                          self.prompt_lens, self.names)

    def save(self, folder: Path, shard_tokens: int = 1 << 22) -> None:
        """safetensors shards of whole sequences (about ``shard_tokens`` rows each)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        shards: list[dict[str, object]] = []
        first = 0
        while first < len(self):
            last = first + 1
            while last < len(self) and self.offsets[last + 1] - self.offsets[first] <= shard_tokens:
                last += 1
            rows = slice(int(self.offsets[first]), int(self.offsets[last]))
            name = f"shard-{len(shards):05d}.safetensors"
            save_file({"tokens": self.tokens[rows].contiguous().cpu(),
                       "features": self.features[rows].contiguous().cpu(),
                       "lengths": self.lengths()[first:last].contiguous(),
                       "prompt_lens": self.prompt_lens[first:last].contiguous()}, folder / name)
            shards.append({"file": name, "names": self.names[first:last]})
            first = last
        (folder / MANIFEST).write_text(json.dumps({"shards": shards}))

    @classmethod
    def load(cls, folder: Path) -> FeatureSet:
        from safetensors.torch import load_file

        parts = []
        for shard in json.loads((folder / MANIFEST).read_text())["shards"]:
            tensors = load_file(folder / shard["file"])
            parts.append((tensors, shard["names"]))
        return cls.concat([
            cls(t["tokens"], t["features"], _offsets(t["lengths"]), t["prompt_lens"], names)
            for t, names in parts])

    @classmethod
    def concat(cls, sets: Sequence[FeatureSet]) -> FeatureSet:
        return cls(torch.cat([s.tokens for s in sets]), torch.cat([s.features for s in sets]),
                   _offsets(torch.cat([s.lengths() for s in sets])),
                   torch.cat([s.prompt_lens for s in sets]), [n for s in sets for n in s.names])


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).long()


@torch.no_grad()
def forward_features(model: LlamaForCausalLM, sequences: Sequence[torch.Tensor]) -> torch.Tensor:
    """The target's forward() over a batch of whole sequences, each in its own contiguous slots
    (sequence b owns slots b * N .. b * N + len - 1); returns [sum len, H] in input order."""
    device = model.lm_head.weight.device
    config = model.config
    lengths = torch.tensor([len(s) for s in sequences])
    num_batch, width = len(sequences), int(lengths.max())
    base = torch.arange(num_batch) * width
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    write_slots = torch.repeat_interleave(base, lengths) + positions
    key_slots = base[:, None] + torch.arange(width)[None, :]
    meta = build_metadata(write_slots.to(device), key_slots.to(device),
                          torch.zeros(num_batch, dtype=torch.long, device=device),
                          lengths.to(device), width)
    dtype = model.lm_head.weight.dtype
    pool_shape = (num_batch * width + 1, config.num_kv_heads, config.head_dim)
    k = [torch.zeros(pool_shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
    v = [torch.zeros(pool_shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
    input_ids = torch.cat([s.to(device) for s in sequences])
    return model(input_ids, positions.to(device), (k, v), meta)


def features_for(model: LlamaForCausalLM, sequences: Sequence[list[int]], max_batch_tokens: int,
                 store_dtype: torch.dtype, progress: bool = True) -> list[torch.Tensor]:
    """forward_features over many sequences, batched by length; rows stored in ``store_dtype``
    on the model's device."""
    from tqdm import tqdm

    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    bar = tqdm(total=len(sequences), desc="features", unit="seq", disable=not progress)
    while order:
        batch = [order.pop(0)]
        while order and (len(batch) + 1) * len(sequences[order[0]]) <= max_batch_tokens:
            batch.append(order.pop(0))
        rows = forward_features(model, [torch.tensor(sequences[i]) for i in batch])
        for i, part in zip(batch, rows.split([len(sequences[i]) for i in batch]), strict=True):
            out[i] = part.to(store_dtype)
        bar.update(len(batch))
    bar.close()
    return out


@dataclass(frozen=True)
class CollectConfig:
    max_new_tokens: int = 256
    replies: str = "self"  # "self": the target's greedy replies; "sharegpt": the data set's
    generate_batch_tokens: int = 1 << 16  # batch size x (prompt + reply) cache columns
    feature_batch_tokens: int = 1 << 14
    store_dtype: torch.dtype = torch.bfloat16
    progress: bool = True


def collect(target: LlamaForCausalLM, generator_model: LlamaForCausalLM | None,
            prompts: PromptSet, eos_id: int | None, config: CollectConfig) -> FeatureSet:
    """Replies (generated or given), then the target's features over prompt + reply."""
    if config.replies == "self":
        generator = GreedyGenerator(generator_model or target, eos_id)
        replies = generate_all(generator, prompts.prompt_ids, config.max_new_tokens,
                               config.generate_batch_tokens, config.progress)
    elif config.replies == "sharegpt":
        if prompts.reply_ids is None:
            raise ValueError("these prompts carry no ShareGPT replies")
        replies = [r[: config.max_new_tokens] for r in prompts.reply_ids]
    else:
        raise ValueError(f"unknown reply source {config.replies!r}")
    sequences = [list(p) + list(r) for p, r in zip(prompts.prompt_ids, replies, strict=True)]
    rows = features_for(target, sequences, config.feature_batch_tokens, config.store_dtype,
                        config.progress)
    device = rows[0].device if rows else torch.device("cpu")
    return FeatureSet(
        tokens=torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=device),
        features=torch.cat(rows) if rows else torch.empty(0),
        offsets=_offsets(torch.tensor([len(s) for s in sequences])),
        prompt_lens=torch.tensor([len(p) for p in prompts.prompt_ids]),
        names=list(prompts.names),
    )
