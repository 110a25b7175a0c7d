"""EAGLE head: construction over a tiny random target, save/load round trip, target parts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draft_service.eagle.head import (
    EagleConfig,
    EagleHead,
    head_from_target_state,
    load_head,
    random_head,
    save_head,
)
from model_runtime.attention import build_metadata
from model_runtime.config import ModelConfig
from model_runtime.llama import LlamaForCausalLM


def tiny_hf_config(tie: bool = True, hidden_size: int = 32):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=101,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
    )


def tiny_target(tie: bool = True, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(ModelConfig.from_hf(tiny_hf_config(tie), name="tiny")).eval()


def tiny_head(seed: int = 1, dtype: torch.dtype = torch.float64, tie: bool = True) -> EagleHead:
    """A random head over a tiny random target, with weights large enough that attention
    matters (so KV mistakes change the outputs)."""
    target = tiny_target(tie)
    head = head_from_target_state(target.config, target.state_dict(), seed)
    head.init_trainable(seed, std=0.3)
    return head.to(dtype)


def save_tiny_checkpoint(path: Path, tie: bool = True, hidden_size: int = 32) -> None:
    """config.json + model.safetensors in transformers' layout, as resolve_checkpoint gives."""
    from safetensors.torch import save_file

    hf = tiny_hf_config(tie, hidden_size)
    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelConfig.from_hf(hf))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if tie:
        state.pop("lm_head.weight")
    path.mkdir(parents=True)
    hf.to_json_file(path / "config.json")
    save_file(state, path / "model.safetensors")


def run_sequence(head: EagleHead, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The head over one causal sequence of pairs at positions 0..n-1, on a fresh pool."""
    target = head.config.target
    n = token_ids.numel()
    shape = (n + 1, target.num_kv_heads, target.head_dim)
    dtype = head.fc.weight.dtype
    kv = ([torch.zeros(shape, dtype=dtype)], [torch.zeros(shape, dtype=dtype)])
    slots = torch.arange(n)
    meta = build_metadata(slots, slots[None], torch.tensor([0]), torch.tensor([n]), n)
    with torch.inference_mode():
        return head(token_ids, hidden, slots, kv, meta)


@pytest.mark.parametrize("tie", [True, False])
def test_save_load_round_trip(tmp_path: Path, tie: bool) -> None:
    checkpoint = tmp_path / "target"
    save_tiny_checkpoint(checkpoint, tie=tie)
    head = random_head(checkpoint, seed=3)
    save_head(head, tmp_path / "head")
    loaded = load_head(tmp_path / "head", checkpoint, torch.float32, "cpu")
    assert loaded.config == head.config
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "head" / "model.safetensors")
    assert saved and all(k.startswith(("fc.", "layers.0.")) for k in saved)
    tokens, hidden = torch.randint(0, 101, (7,)), torch.randn(7, 32)
    torch.testing.assert_close(
        run_sequence(loaded, tokens, hidden), run_sequence(head, tokens, hidden), rtol=0, atol=0
    )


def test_random_head_is_deterministic_and_frozen_where_it_should_be(tmp_path: Path) -> None:
    checkpoint = tmp_path / "target"
    save_tiny_checkpoint(checkpoint)
    a, b, c = random_head(checkpoint, 5), random_head(checkpoint, 5), random_head(checkpoint, 6)
    torch.testing.assert_close(a.fc.weight, b.fc.weight, rtol=0, atol=0)
    assert not torch.equal(a.fc.weight, c.fc.weight)
    trainable = {n for n, p in a.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("fc.", "layers.")) for n in trainable)
    assert a.lm_head.weight is a.embed_tokens.weight  # tied, as in the target


def test_head_logits_are_the_targets_norm_and_lm_head() -> None:
    target = tiny_target(tie=False)
    head = head_from_target_state(target.config, target.state_dict(), seed=0)
    features = torch.randn(5, 32) * 3
    with torch.inference_mode():
        torch.testing.assert_close(head.logits(features), target.logits(features))
    assert head.logits(features).dtype == torch.float32
    assert head.to(torch.float64).logits(features.double()).dtype == torch.float64


def test_input_order_is_embedding_then_hidden() -> None:
    head = tiny_head(dtype=torch.float64)
    tokens, hidden = torch.randint(0, 101, (4,)), torch.randn(4, 32, dtype=torch.float64)
    with torch.no_grad():
        head.fc.weight[:, 32:] = 0  # the hidden half no longer contributes
    other_hidden = torch.randn(4, 32, dtype=torch.float64)
    torch.testing.assert_close(
        run_sequence(head, tokens, hidden), run_sequence(head, tokens, other_hidden)
    )


def test_load_rejects_a_head_for_another_target(tmp_path: Path) -> None:
    save_tiny_checkpoint(tmp_path / "small")
    save_tiny_checkpoint(tmp_path / "wide", hidden_size=64)
    save_head(random_head(tmp_path / "small", 0), tmp_path / "head")
    with pytest.raises(ValueError, match="another target"):
        load_head(tmp_path / "head", tmp_path / "wide", torch.float32, "cpu")


def test_config_json_round_trip() -> None:
    config = EagleConfig(target=tiny_target().config, num_layers=1)
    assert EagleConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError):
        EagleConfig.from_json('{"format": "other"}')


def test_hot_vocab_restricts_proposals_and_survives_save_load(tmp_path: Path) -> None:
    checkpoint = tmp_path / "target"
    save_tiny_checkpoint(checkpoint)
    head = random_head(checkpoint, seed=5)
    features = torch.randn(6, 32)
    full_p, full_tokens = head.draft_distribution(features, 3)
    logits = head.logits(features)
    torch.testing.assert_close(full_p, torch.softmax(logits, -1).topk(3, -1).values)
    hot = torch.tensor([3, 17, 42, 64, 80, 99])
    head.set_hot_vocab(hot)
    probs, tokens = head.draft_distribution(features, 3)
    assert set(tokens.flatten().tolist()) <= set(hot.tolist())
    expected = torch.softmax(logits[:, hot], -1).topk(3, -1)
    torch.testing.assert_close(probs, expected.values)
    assert torch.equal(tokens, hot[expected.indices])
    save_head(head, tmp_path / "head")
    loaded = load_head(tmp_path / "head", checkpoint, torch.float32, "cpu")
    assert loaded.hot_token_ids is not None and torch.equal(loaded.hot_token_ids, hot)
