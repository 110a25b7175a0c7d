"""Model shape, read once from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Command-line dtype names (aliases included) -> torch dtype attribute names.
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float64": "float64",
    "fp64": "float64",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
DTYPE_CHOICES = sorted([*DTYPES, "auto"])
# CPU flags of native bf16 matrix math (AMX tiles, AVX-512 BF16 dot products).
NATIVE_BF16_CPU_FLAGS = {"amx_bf16", "avx512_bf16"}
AMX_CPU_FLAG = "amx_bf16"
CPUINFO = Path("/proc/cpuinfo")


def resolve_dtype(
    name: str, device: str, cpu_fp32_kernel: bool = False, cpuinfo: Path = CPUINFO
) -> str:
    """A dtype name or alias -> torch attribute name; "auto" picks by device.

    "auto" is bfloat16 on CUDA and on CPUs that multiply bf16 natively (it halves the weight
    traffic there), float32 elsewhere, where bf16 is emulated and slower. Where the caller runs
    float32's few-row steps on the project's kernel (``cpu_fp32_kernel``) it is float32 on a
    CPU with AVX-512 BF16 but no AMX: there the EAGLE head's draft round took 11.1-11.7 ms in
    float32 against 12.5-14.5 in bf16 (2-core AMD EPYC, 2026-12-06, docs/cpu.md); on AMX, bf16
    stays (not measured against the kernel). It suits drafters, whose numerics never change
    the output. The target defaults to float32 on purpose: in bf16 a CPU's many-token verify
    and one-token decode round differently, so greedy output with speculation could differ
    from target-only at near-ties.
    """
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; choose one of {DTYPE_CHOICES}")
        return DTYPES[name]
    if device.startswith("cuda"):
        return "bfloat16"
    flags = cpu_flags(cpuinfo) if device == "cpu" else set()
    if cpu_fp32_kernel and AMX_CPU_FLAG not in flags:
        return "float32"
    return "bfloat16" if NATIVE_BF16_CPU_FLAGS & flags else "float32"


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        text = cpuinfo.read_text()
    except OSError:  # not Linux: assume emulated bf16
        return set()
    return set(next((line for line in text.splitlines() if line.startswith("flags")), "").split())


def cpu_has_native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    return bool(NATIVE_BF16_CPU_FLAGS & cpu_flags(cpuinfo))


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder. Built from a transformers config; never mutated."""

    name: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @classmethod
    def from_hf(cls, hf: Any, name: str = "") -> ModelConfig:
        rope = getattr(hf, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"rope type {rope_type!r} is not supported (only 'default')")
        theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        eos = hf.eos_token_id[0] if isinstance(hf.eos_token_id, list) else hf.eos_token_id
        return cls(
            name=name or getattr(hf, "_name_or_path", "") or hf.model_type,
            architecture=hf.model_type,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=hf.num_attention_heads,
            num_kv_heads=hf.num_key_value_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope_theta=float(theta),
            max_position=hf.max_position_embeddings,
            tie_word_embeddings=bool(hf.tie_word_embeddings),
            bos_token_id=hf.bos_token_id,
            eos_token_id=eos,
        )
