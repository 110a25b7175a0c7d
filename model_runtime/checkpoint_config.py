"""A checkpoint's ModelConfig from its config.json, without importing transformers if it can.

Importing transformers for AutoConfig costs 2-3 s of CPU at every start of a target or an EAGLE
drafter (the import, not the read); a test suite starts dozens. A Llama config.json that spells
out every field ModelConfig takes (the ones transformers writes when it converts a GGUF, the
test models' ones) reads the same from the JSON; anything else (another model type, a missing
field that LlamaConfig would default, rope scaling) still goes through AutoConfig.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from model_runtime.config import ModelConfig

# Every field ModelConfig.from_hf reads, besides head_dim (derived when absent, as LlamaConfig
# does) and the rope theta (rope_parameters or rope_theta, one of which must be there).
EXPLICIT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
)


def read_model_config(checkpoint: Path, name: str = "") -> ModelConfig:
    """The ModelConfig of the checkpoint folder (config.json + safetensors)."""
    raw = json.loads((checkpoint / "config.json").read_text())
    if is_explicit_llama(raw):
        # AutoConfig names a folder's config after the path it was given.
        fields = {**raw, "_name_or_path": str(checkpoint)}
        return ModelConfig.from_hf(SimpleNamespace(**fields), name=name)
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.from_pretrained(checkpoint), name=name)


def is_explicit_llama(raw: dict[str, Any]) -> bool:
    """A plain Llama config whose every field ModelConfig needs is written out."""
    rope = raw.get("rope_parameters")
    plain_rope = rope is None or (isinstance(rope, dict) and rope.get("rope_type") == "default")
    has_theta = "rope_theta" in raw or (isinstance(rope, dict) and "rope_theta" in rope)
    return (
        raw.get("model_type") == "llama"
        and all(raw.get(key) is not None for key in EXPLICIT_FIELDS)
        and raw.get("rope_scaling") is None
        and plain_rope
        and has_theta
    )
