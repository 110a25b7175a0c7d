"""The merged layer kernels (kernels/layer_ops.py) against their torch references, and the GPU
decoder body (model_runtime/fused_layers.py) against the plain layer loop.

On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported), on CUDA compiled. Outputs and pools are poisoned first, so a skipped element fails.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.helpers.kernel_checks import DEVICE, DTYPES, ON_CUDA, assert_matches

layer_ops = pytest.importorskip("kernels.layer_ops", reason="triton is not installed")

from kernels import layer_reference  # noqa: E402
from model_runtime.fused_layers import is_merged, merge_projections  # noqa: E402
from tests.helpers.spec_fixtures import load_copy, load_fp64  # noqa: E402
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: E402, F401 (fixture)
from tests.test_paged_attention import needs_paged_engine, run_engine  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(1, 9, 3, 64), (7, 32, 8, 128)])
def test_rope_and_store(dtype, tokens: int, heads: int, kv_heads: int, head_dim: int) -> None:
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE).to(dtype)
    angles = torch.rand(tokens, head_dim // 2, device=DEVICE) * 6.3
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slots = torch.randperm(40, device=DEVICE)[:tokens]
    pools = [torch.full((41, kv_heads, head_dim), float("nan"), device=DEVICE, dtype=dtype)
             for _ in range(4)]  # fmt: skip
    q_out = torch.full((tokens, heads, head_dim), float("nan"), device=DEVICE, dtype=dtype)
    got = layer_ops.rope_and_store(qkv, cos, sin, slots, pools[0], pools[1], heads, out=q_out)
    want = layer_reference.rope_and_store(qkv, cos, sin, slots, pools[2], pools[3], heads)
    assert_matches(got, want)
    for mine, theirs in ((pools[0], pools[2]), (pools[1], pools[3])):
        assert_matches(mine[slots], theirs[slots])
        untouched = torch.ones(41, dtype=torch.bool, device=DEVICE)
        untouched[slots] = False
        assert mine[untouched].isnan().all(), "a slot outside the step was written"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 576), (5, 4096), (3, 100)])
def test_add_rms_norm(dtype, rows: int, cols: int) -> None:
    x, residual = (torch.randn(rows, cols, device=DEVICE).to(dtype) * 3 for _ in range(2))
    weight = (torch.rand(cols, device=DEVICE) + 0.5).to(dtype)
    normed, total = layer_ops.add_rms_norm(x, residual, weight, 1e-5)
    want_normed, want_total = layer_reference.add_rms_norm(x, residual, weight, 1e-5)
    if ON_CUDA or dtype == torch.float32:  # Triton's interpreter truncates fp32 -> bf16
        assert torch.equal(total, want_total), "the sum must round as torch's add rounds"
    assert_matches(total, want_total)
    assert_matches(normed, want_normed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 1536), (6, 1000)])
def test_silu_mul_halves(dtype, rows: int, width: int) -> None:
    gate_up = (torch.randn(rows, 2 * width, device=DEVICE) * 4).to(dtype)
    assert_matches(layer_ops.silu_mul_halves(gate_up), layer_reference.silu_mul_halves(gate_up))


def test_merged_projections_are_views_of_one_weight(engine_model_dir: Path) -> None:
    model = copy.deepcopy(load_fp64(engine_model_dir))
    attn = model.model.layers[0].self_attn
    q_before = attn.q_proj.weight.detach().clone()
    merge_projections(model)
    assert is_merged(model)
    assert torch.equal(attn.q_proj.weight, q_before)
    assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()


@needs_paged_engine
def test_fused_body_computes_what_the_layer_loop_computes(engine_model_dir: Path) -> None:
    """Prefill, mixed decode + prefill and random tree verifies, paged attention both times."""
    plain = load_copy(engine_model_dir, DEVICE, torch.float32)
    merged = copy.deepcopy(plain)
    merge_projections(merged)
    # Two trees (two requests): on CPU the attention runs in Triton's interpreter, seconds a tree.
    with_loop, with_fused = run_engine(plain, "paged", 0, 2), run_engine(merged, "paged", 0, 2)
    assert with_fused[:2] == with_loop[:2]
    for (ids_f, hidden_f), (ids_l, hidden_l) in zip(with_fused[2:], with_loop[2:], strict=True):
        assert ids_f == ids_l
        torch.testing.assert_close(hidden_f, hidden_l, rtol=1e-4, atol=1e-4)
