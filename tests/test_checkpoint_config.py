"""read_model_config (no transformers import) gives what AutoConfig gives, or asks AutoConfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_runtime.checkpoint_config import is_explicit_llama, read_model_config
from model_runtime.config import ModelConfig
from model_runtime.loading import default_model_path, resolve_checkpoint
from plumbing.paths import default_cache_dir
from tests.helpers.tiny_llama import TinyLlama, tiny_llama_dir


def auto_config(folder: Path) -> ModelConfig:
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.from_pretrained(folder))


def test_the_converted_default_model_reads_as_autoconfig_reads_it() -> None:
    checkpoint = resolve_checkpoint(default_model_path(), default_cache_dir())
    assert is_explicit_llama(json.loads((checkpoint / "config.json").read_text()))
    assert read_model_config(checkpoint) == auto_config(checkpoint)
    assert read_model_config(checkpoint, name="x").name == "x"


@pytest.mark.parametrize("tied", [False, True])
def test_a_test_model_reads_as_autoconfig_reads_it(tmp_path: Path, tied: bool) -> None:
    folder = tiny_llama_dir(tmp_path, TinyLlama(tie_word_embeddings=tied, with_tokenizer=False))
    assert is_explicit_llama(json.loads((folder / "config.json").read_text()))
    assert read_model_config(folder) == auto_config(folder)


@pytest.mark.parametrize(
    "change",
    [
        {"num_key_value_heads": None},  # LlamaConfig's default: as many as the attention heads
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"model_type": "mistral"},
    ],
)
def test_a_config_it_cannot_read_alone_goes_through_autoconfig(
    tmp_path: Path, change: dict
) -> None:
    folder = tiny_llama_dir(tmp_path, TinyLlama(with_tokenizer=False))
    raw = json.loads((folder / "config.json").read_text())
    raw.update(change)
    raw = {k: v for k, v in raw.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(raw))
    assert not is_explicit_llama(raw)
    if "rope_scaling" in change:
        with pytest.raises(ValueError, match="rope type"):
            read_model_config(folder)
    else:
        assert read_model_config(folder) == auto_config(folder)
