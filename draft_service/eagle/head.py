"""The EAGLE draft head for a Llama-family target, and how it is saved and loaded.

Feature semantics (fixed by the project): the target's hidden state h_t is its last decoder
layer's output *before* the final norm at position t. The head's step at position t reads
(embed(x_{t+1}), h_t) and predicts the feature at t + 1 in that same pre-norm space, so the
target's own final norm and lm_head turn it into the distribution of x_{t+2}.

Input order follows EAGLE-1/2 (``fc(cat(embed, hidden))``): the token embedding comes first.

Only ``fc`` and the decoder layer are the head's own weights; the embedding, final norm and
lm_head are the target's, frozen, and always read from the target checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model_runtime import fused, fused_layers
from model_runtime.attention import AttentionMetadata
from model_runtime.config import ModelConfig
from model_runtime.layers import RMSNorm, RotaryTable
from model_runtime.llama import DecoderLayer
from model_runtime.packed_linear import Linear
from model_runtime.paged import PagedMetadata
from plumbing.errors import StartupRefused

CONFIG_FILE = "eagle_config.json"
WEIGHTS_FILE = "model.safetensors"
HOT_VOCAB_FILE = "hot_vocab.safetensors"  # optional: the token ids the draft may propose
FORMAT = "splitspec-eagle-1"
TRAINABLE_PREFIXES = ("fc.", "layers.")
# Target checkpoint key -> head parameter, for the frozen parts (transformers' Llama names).
TARGET_KEYS = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


class HeadUnusable(StartupRefused, ValueError):
    """An EAGLE head folder that is not there, not whole, or built for another target."""


KVPools = tuple[list[torch.Tensor], list[torch.Tensor]]


@dataclass(frozen=True)
class EagleConfig:
    """Shape of a head: the target's shape plus the head's own layer count."""

    target: ModelConfig
    num_layers: int = 1
    fc_bias: bool = True  # EAGLE-1/2 heads carry a bias on the fusing projection

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> EagleConfig:
        raw: dict[str, Any] = json.loads(text)
        if raw.pop("format", None) != FORMAT:
            raise ValueError(f"not a {FORMAT} head config")
        return cls(target=ModelConfig(**raw.pop("target")), **raw)


class EagleHead(nn.Module):
    """fc([embed(x_{t+1}); h_t]) -> decoder layer(s) -> predicted pre-norm feature at t + 1.

    The layers read and write a slot-indexed KV pool through AttentionMetadata exactly like the
    target's, at the position t of the hidden row they consume.
    """

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        target = config.target
        hidden = target.hidden_size
        self.config = config
        self.embed_tokens = nn.Embedding(target.vocab_size, hidden)
        self.fc = Linear(2 * hidden, hidden, bias=config.fc_bias)
        self.layers = nn.ModuleList(DecoderLayer(target) for _ in range(config.num_layers))
        self.norm = RMSNorm(hidden, target.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, target.vocab_size, bias=False)
        if target.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryTable(target.head_dim, target.max_position, target.rope_theta)
        for module in (self.embed_tokens, self.norm, self.lm_head):
            module.requires_grad_(False)
        # FR-Spec style reduced draft vocabulary: projecting onto a few thousand frequent tokens
        # instead of all 49k makes a draft step several times cheaper. Drafts only: the target
        # still verifies against its full distribution, so output is unchanged. The hot rows
        # of lm_head are a Linear of their own so that CPU prepacking covers them
        # (model_runtime/packed_linear.py): on a 2-core CPU torch's 1-4-row projection onto
        # the shipped 16,384 ids was most of a draft round.
        self.hot_token_ids: torch.Tensor | None = None
        self.hot_head: Linear | None = None

    def set_hot_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Restricts proposals to ``token_ids`` (None: the whole vocabulary)."""
        if token_ids is None:
            self.hot_token_ids, self.hot_head = None, None
            return
        weight = self.lm_head.weight.detach()
        ids = token_ids.to(device=weight.device, dtype=torch.long)
        self.hot_token_ids = ids
        hot_head = Linear(weight.shape[1], len(ids), bias=False, device="meta")
        hot_head.weight = nn.Parameter(weight[ids].contiguous(), requires_grad=False)
        self.hot_head = hot_head

    def draft_distribution(
        self, features: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k (probabilities, token ids) of the draft over its vocabulary, per row."""
        normed = self.norm(features)
        if self.hot_head is None or self.hot_token_ids is None:
            probs, index = fused.softmax_topk(self.lm_head(normed), k)
            return probs, index
        probs, index = fused.softmax_topk(self.hot_head(normed), k)
        tokens = self.hot_token_ids[index]
        return probs, tokens

    @property
    def hidden_size(self) -> int:
        return self.config.target.hidden_size

    def forward(
        self,
        token_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv: KVPools,
        meta: AttentionMetadata | PagedMetadata,
    ) -> torch.Tensor:
        """token_ids [T] (x_{t+1}), hidden [T, H] (h_t), positions [T] (t) -> features [T, H]."""
        x = self.fc(torch.cat([self.embed_tokens(token_ids), hidden.to(self.fc.weight.dtype)], -1))
        rotary = self.rotary(positions, x.dtype)
        if isinstance(meta, PagedMetadata) and fused_layers.layers_merged(self.layers):
            return fused_layers.fused_body(self.layers, x, rotary, kv, meta)  # the GPU path
        for layer, k_pool, v_pool in zip(self.layers, kv[0], kv[1], strict=True):
            x = layer(x, rotary, (k_pool, v_pool), meta)
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Target's norm + lm_head; fp32 (fp64 for an fp64 head, so tests can compare exactly)."""
        logits = self.lm_head(self.norm(features))
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The head's own weights (fc and layers): what a head checkpoint holds."""
        return {k: v for k, v in self.state_dict().items() if k.startswith(TRAINABLE_PREFIXES)}

    def load_target_parts(self, target_state: dict[str, torch.Tensor]) -> None:
        """Copies the target's embedding, final norm and (untied) lm_head into the head."""
        wanted = dict(TARGET_KEYS)
        if self.config.target.tie_word_embeddings:
            wanted.pop("lm_head.weight")
        missing = [k for k in wanted if k not in target_state]
        if missing:
            raise ValueError(f"target checkpoint lacks {missing}")
        own = self.state_dict()
        with torch.no_grad():
            for source, name in wanted.items():
                own[name].copy_(target_state[source])

    def init_trainable(self, seed: int, std: float = 0.02) -> None:
        """Deterministic random fc/layer weights (norm weights one, biases zero)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if not name.startswith(TRAINABLE_PREFIXES):
                    continue
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    sample = torch.randn(param.shape, generator=generator, dtype=torch.float64)
                    param.copy_(sample * std)


# ---- construction, save and load --------------------------------------------------------


def head_from_target_state(
    target: ModelConfig,
    target_state: dict[str, torch.Tensor],
    seed: int,
    num_layers: int = 1,
) -> EagleHead:
    """A head with random trainable weights over an in-memory target state (fp32, CPU)."""
    head = EagleHead(EagleConfig(target=target, num_layers=num_layers))
    head.init_trainable(seed)
    head.load_target_parts(target_state)
    return head.eval()


def random_head(
    target_checkpoint: Path,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> EagleHead:
    """Random fc + layer over a target checkpoint dir (config.json + *.safetensors).

    For a GGUF target, pass ``model_runtime.loading.resolve_checkpoint(gguf, cache_root)``.
    """
    target = read_target_config(target_checkpoint)
    head = head_from_target_state(target, read_target_parts(target_checkpoint), seed)
    return head.to(device=device, dtype=dtype)


def save_head(head: EagleHead, head_dir: Path) -> None:
    """Writes eagle_config.json and the trainable weights; the target parts are not saved."""
    from safetensors.torch import save_file

    head_dir.mkdir(parents=True, exist_ok=True)
    (head_dir / CONFIG_FILE).write_text(head.config.to_json())
    state = {k: v.detach().contiguous().cpu() for k, v in head.trainable_state_dict().items()}
    save_file(state, head_dir / WEIGHTS_FILE)
    if head.hot_token_ids is not None:
        save_file({"token_ids": head.hot_token_ids.cpu()}, head_dir / HOT_VOCAB_FILE)


def check_head_dir(head_dir: Path) -> None:
    """HeadUnusable unless ``head_dir`` holds a head's files (cheap: before loading a target)."""
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (head_dir / name).is_file():
            raise HeadUnusable(f"EAGLE head {head_dir}: no {name} there (a head folder is what "
                               "`splitspec train-draft` writes)")  # fmt: skip


def load_head(
    head_dir: Path,
    target_checkpoint: Path,
    dtype: torch.dtype,
    device: torch.device | str,
) -> EagleHead:
    """Loads a head saved by save_head over the target checkpoint it was trained for."""
    from safetensors.torch import load_file

    check_head_dir(head_dir)
    config = EagleConfig.from_json((head_dir / CONFIG_FILE).read_text())
    check_same_shape(config.target, read_target_config(target_checkpoint))
    head = EagleHead(config)
    trainable = load_file(head_dir / WEIGHTS_FILE)
    expected = set(head.trainable_state_dict())
    if set(trainable) != expected:
        raise HeadUnusable(f"head weights mismatch: {sorted(set(trainable) ^ expected)}")
    head.load_state_dict(trainable, strict=False)
    head.load_target_parts(read_target_parts(target_checkpoint))
    head = head.to(device=device, dtype=dtype).eval()
    hot_file = head_dir / HOT_VOCAB_FILE
    if hot_file.exists():
        head.set_hot_vocab(load_file(hot_file)["token_ids"])
    return head


def read_target_config(target_checkpoint: Path) -> ModelConfig:
    from model_runtime.checkpoint_config import read_model_config

    return read_model_config(target_checkpoint)


def read_target_parts(target_checkpoint: Path) -> dict[str, torch.Tensor]:
    """Only the embedding, final norm and lm_head tensors of a safetensors checkpoint."""
    from safetensors import safe_open

    shards = sorted(target_checkpoint.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors in {target_checkpoint}")
    found: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in set(TARGET_KEYS) & set(f.keys()):
                found[key] = f.get_tensor(key)
    return found


def check_same_shape(saved: ModelConfig, target: ModelConfig) -> None:
    """A head only fits the target shape it was built for (the name may differ)."""
    a, b = asdict(saved), asdict(target)
    diff = [k for k in a if k != "name" and a[k] != b[k]]
    if diff:
        raise HeadUnusable(f"the EAGLE head was built for another target: {diff} differ")
