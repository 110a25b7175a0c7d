"""TargetConfig's checks of --exact and --attention (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import few_row_linear
from target_service.config import TargetConfig


def config(**kwargs) -> TargetConfig:
    return TargetConfig(model_path=Path("."), cache_dir=Path("."), **kwargs)


def test_exact_on_cpu_is_fp32_and_paged() -> None:
    with pytest.raises(ValueError, match="--exact on CPU is fp32"):
        config(exact=True, attention="paged", dtype="bfloat16")
    with pytest.raises(ValueError, match="needs the paged attention"):
        config(exact=True, attention="torch")
    assert config(exact=True, attention="paged").exact


def test_exact_on_cuda_takes_bf16() -> None:
    assert config(exact=True, attention="paged", device="cuda", dtype="bfloat16").exact


def test_auto_attention_on_cpu_is_the_paged_kernel_in_fp32_where_it_builds() -> None:
    can_build = few_row_linear.unavailable_reason() is None
    assert config().attention_backend == ("paged" if can_build else "torch")
    assert config(dtype="bfloat16").attention_backend == "torch"  # the kernel is fp32
    assert config(attention="torch").attention_backend == "torch"


def test_unknown_attention_backends_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown attention"):
        config(attention="flash")
