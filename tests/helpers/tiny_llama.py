"""A tiny random Llama for end-to-end tests, written as a HF-style folder, and its oracle head.

The folder (config.json, model.safetensors and the default model's tokenizer, chat template and
EOS) loads like any checkpoint in the target, the drafters and the router; fp64 makes greedy
outputs exactly comparable. Folders are built once per pytest run (keyed by shape), whichever
module asks first. Fixtures (``*_fixture``, used under their ``name``) are imported into the
test modules that use them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pytest

# ---- the tiny model ------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyLlama:
    """Shape of a random Llama. vocab_size 49152 matches the default tokenizer."""

    vocab_size: int = 49152
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position: int = 2048
    tie_word_embeddings: bool = False
    seed: int = 0
    layer_scale: float = 1.0  # scales o_proj and down_proj: how far a layer moves the residual
    logit_scale: float = 1.0  # scales lm_head: how peaked next-token distributions are
    with_tokenizer: bool = True

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def hf_config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "float32",
        }


def write_tiny_llama(shape: TinyLlama, out_dir: Path) -> Path:
    """Writes the model folder atomically (a temporary folder renamed into place)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from model_runtime.config import ModelConfig
    from model_runtime.llama import LlamaForCausalLM

    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(shape.hf_config(), indent=2))
    config = ModelConfig.from_hf(AutoConfig.from_pretrained(tmp), name="tiny-llama")
    torch.manual_seed(shape.seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2)  # not all ones, so the norms matter
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(shape.layer_scale)
            elif name == "lm_head.weight":
                param.mul_(shape.logit_scale)
    state = {
        k: v.detach().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("rotary")
    }
    if shape.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, tmp / "model.safetensors")
    if shape.with_tokenizer:
        export_default_tokenizer(tmp)
    os.replace(tmp, out_dir)
    return out_dir


def required(token_id: int | None, name: str) -> int:
    if token_id is None:
        raise ValueError(f"the default model's GGUF names no {name} token")
    return token_id


def export_default_tokenizer(out_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json (chat template, BOS, EOS) of the default model."""
    from model_runtime.loading import default_model_path
    from router.gguf_tokenizer import load_gguf_tokenizer

    gguf = load_gguf_tokenizer(str(default_model_path()))
    gguf.backend.save(str(out_dir / "tokenizer.json"))
    config = {
        "bos_token": gguf.backend.id_to_token(required(gguf.bos_token_id, "bos")),
        "eos_token": gguf.backend.id_to_token(required(gguf.eos_token_id, "eos")),
        "chat_template": gguf.chat_template,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def tiny_llama_dir(root: Path, shape: TinyLlama = TinyLlama()) -> Path:
    """The model folder for ``shape`` under ``root``, built on first use."""
    out_dir = root / f"tiny-llama-{shape.key()}"
    if not (out_dir / "config.json").is_file():
        write_tiny_llama(shape, out_dir)
    return out_dir


def write_oracle_head(model_dir: Path, head_dir: Path) -> Path:
    """An EAGLE head that re-runs a ONE-layer target: fc = [I | 0] feeds the token embedding
    through, and the head's layer is the target's layer. Its features then equal the target's
    hidden states up to two differences: the head never sees the context's first token (it reads
    x_{t+1}), and RoPE runs one position lower (attention is shift-invariant). So it drafts the
    target's own greedy continuation most of the time, not always: the EAGLE tree accepts long
    paths, through first and later children."""
    import torch
    from safetensors.torch import load_file

    from draft_service.eagle.head import random_head, save_head

    head = random_head(model_dir, seed=0, dtype=torch.float64)
    target = load_file(model_dir / "model.safetensors")
    hidden = head.hidden_size
    assert head.config.target.num_layers == 1, "the oracle head copies a one-layer target"
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1))
        head.fc.bias.zero_()
        for name, param in head.layers[0].named_parameters():
            param.copy_(target[f"model.layers.0.{name}"])
    save_head(head, head_dir)
    return head_dir


# The end-to-end model: one layer (so `write_oracle_head` can copy it), layers strong enough that
# greedy outputs fall into loops now and then (prompt lookup gets accepted), and a sharp enough
# LM head that EAGLE-2 trees grow deep.
E2E_MODEL = TinyLlama(
    hidden_size=32, intermediate_size=64, num_layers=1, layer_scale=5.0, logit_scale=10.0
)


@pytest.fixture(scope="session", name="tiny_model_dir")
def tiny_model_dir_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """E2E_MODEL's folder (vocabulary 49152, the default model's tokenizer)."""
    return tiny_llama_dir(tmp_path_factory.getbasetemp(), E2E_MODEL)


@pytest.fixture(scope="session", name="engine_model_dir")
def engine_model_dir_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """E2E_MODEL's weights without a tokenizer: for engine tests, which need no default model
    (so the GPU box runs them without the 98 MB GGUF carried over)."""
    shape = replace(E2E_MODEL, with_tokenizer=False)
    return tiny_llama_dir(tmp_path_factory.getbasetemp(), shape)


@pytest.fixture(scope="session", name="oracle_head_dir")
def oracle_head_dir_fixture(tiny_model_dir: Path) -> Path:
    """A `write_oracle_head` EAGLE head for E2E_MODEL."""
    head_dir = tiny_model_dir.with_name(tiny_model_dir.name + "-oracle-head")
    if not (head_dir / "eagle_config.json").is_file():
        write_oracle_head(tiny_model_dir, head_dir)
    return head_dir
