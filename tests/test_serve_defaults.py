"""`splitspec serve` defaults: which drafter and dtype a user gets without flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from model_runtime.config import AMX_CPU_FLAG, cpu_flags, cpu_has_native_bf16, resolve_dtype
from splitspec.serve_cli import _draft_args, add_serve_parser, draft_method, pointless_draft_flags


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_default_model_drafts_with_its_shipped_eagle_head() -> None:
    args = serve_args()
    assert draft_method(args) == "eagle"
    (replica,) = _draft_args(args)
    assert replica[replica.index("--method") + 1] == "eagle"
    assert "--eagle-head" not in replica  # the draft service picks the shipped head itself
    assert replica[replica.index("--dtype") + 1] == "auto"  # the draft's dtype
    assert args.dtype == "float32"  # the target's: keeps greedy speculation lossless


def test_other_model_without_a_head_falls_back_to_ngram(tmp_path: Path) -> None:
    assert draft_method(serve_args("--model", str(tmp_path))) == "ngram"
    with_head = serve_args("--model", str(tmp_path), "--eagle-head", str(tmp_path))
    assert draft_method(with_head) == "eagle"
    assert _draft_args(serve_args("--draft-method", "off")) == []


def test_unknown_dtypes_are_refused_before_anything_starts() -> None:
    for flag in ("--dtype", "--draft-dtype"):
        with pytest.raises(SystemExit):
            serve_args(flag, "int3")
    assert serve_args("--dtype", "bf16").dtype == "bf16"


def test_auto_dtype_follows_native_bf16(tmp_path: Path) -> None:
    amx = tmp_path / "amx"
    amx.write_text("processor : 0\nflags : fpu sse avx2 amx_bf16 amx_tile\n")
    plain = tmp_path / "plain"
    plain.write_text("processor : 0\nflags : fpu sse avx2 avx512f\n")
    assert cpu_has_native_bf16(amx) and not cpu_has_native_bf16(plain)
    assert not cpu_has_native_bf16(tmp_path / "missing")
    assert resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == ("bfloat16" if cpu_has_native_bf16() else "float32")
    assert resolve_dtype("bf16", "cpu") == "bfloat16"
    # With the few-row kernel, float32 where bf16 is AVX-512's only (faster there); AMX keeps it.
    epyc = tmp_path / "epyc"
    epyc.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert resolve_dtype("auto", "cpu", cpuinfo=epyc) == "bfloat16"
    assert resolve_dtype("auto", "cpu", cpu_fp32_kernel=True, cpuinfo=epyc) == "float32"
    assert resolve_dtype("auto", "cpu", cpu_fp32_kernel=True, cpuinfo=amx) == "bfloat16"
    assert resolve_dtype("auto", "cpu", cpu_fp32_kernel=True, cpuinfo=plain) == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3", "cpu")


def test_auto_drafter_is_off_on_cuda_and_explicit_choices_stand() -> None:
    assert draft_method(serve_args("--device", "cuda")) == "off"
    assert draft_method(serve_args("--device", "cuda:1")) == "off"
    assert draft_method(serve_args("--device", "cuda", "--draft-method", "eagle")) == "eagle"
    # A head named is EAGLE asked for.
    assert draft_method(serve_args("--device", "cuda", "--eagle-head", "h")) == "eagle"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [(("--draft-method", "off", "--num-steps", "3", "--topk", "2"),
      "--num-steps, --topk: no draft replica runs (--draft-method off); give --draft-method "
      "eagle or ngram, or leave them out"),
     (("--num-draft-replicas", "0", "--draft-threads", "2", "--draft-args", "--threads 1"),
      "--draft-threads, --draft-args: no draft replica runs (--num-draft-replicas 0); give "
      "--num-draft-replicas 1 or more, or leave them out"),
     (("--device", "cuda", "--num-draft-tokens", "32", "--draft-dtype", "float32"),
      "--num-draft-tokens, --draft-dtype: no draft replica runs (--draft-method auto, which is "
      "off on CUDA); give --draft-method eagle or ngram, or leave them out"),
     (("--draft-method", "ngram", "--eagle-head", "h"),
      "--eagle-head: the n-gram drafter has no head; give --draft-method eagle or auto"),
     (("--draft-method", "off"), ""), (("--num-steps", "3", "--topk", "2"), ""),
     (("--device", "cuda", "--draft-method", "ngram", "--topk", "2"), "")],
)  # fmt: skip
def test_draft_flags_where_no_replica_runs_are_refused(argv: tuple[str, ...], problem: str) -> None:
    assert pointless_draft_flags(serve_args(*argv)) == problem


def draft_config(*argv: str):
    from draft_service.arguments import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_a_draft_service_refuses_a_head_it_would_not_use() -> None:
    with pytest.raises(ValueError, match="^--eagle-head is for --method eagle, not ngram$"):
        draft_config("--method", "ngram", "--eagle-head", "h")


@pytest.mark.parametrize(("rows_per_pass", "nodes"), [(16, 8), (6, 6), (None, 8)])
def test_cpu_eagle_trees_fit_one_pass_of_the_kernel(
    monkeypatch: pytest.MonkeyPatch, rows_per_pass: int | None, nodes: int
) -> None:
    """AVX-512's kernel takes 16 rows a pass, AVX2's 6; without the kernel, torch's matmul."""
    from kernels import few_row_linear

    monkeypatch.setattr(few_row_linear, "rows_per_pass", lambda: rows_per_pass)
    config = draft_config("--method", "eagle", "--device", "cpu")
    assert (config.num_steps, config.topk, config.num_draft_tokens) == (5, 4, nodes)


def test_tree_shape_defaults_follow_the_device_and_flags_stand() -> None:
    shape = lambda c: (c.num_steps, c.topk, c.num_draft_tokens)  # noqa: E731
    assert shape(draft_config("--method", "ngram", "--device", "cpu")) == (5, 4, 16)
    assert shape(draft_config("--method", "ngram", "--device", "cuda")) == (5, 4, 16)
    on_gpu = draft_config("--method", "eagle", "--device", "cuda", "--topk", "6")
    assert shape(on_gpu) == (8, 6, 64)  # the CUDA default, the given flag kept
    replica = _draft_args(serve_args())[0]
    assert "--num-steps" not in replica  # serve leaves the shape to the draft service...
    given = _draft_args(serve_args("--num-draft-tokens", "9"))[0]
    assert given[given.index("--num-draft-tokens") + 1] == "9"  # ...unless told


def test_a_cpu_eagle_head_defaults_to_float32_where_the_few_row_kernel_runs() -> None:
    """Its packed float32 steps beat AVX-512 BF16 (model_runtime.config.resolve_dtype); AMX
    keeps bf16."""
    from kernels import few_row_linear

    amx = AMX_CPU_FLAG in cpu_flags()
    native = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert resolve_dtype("auto", "cpu", cpu_fp32_kernel=True) == (native if amx else "float32")
    assert resolve_dtype("auto", "cuda", cpu_fp32_kernel=True) == "bfloat16"
    kernel_runs = few_row_linear.unavailable_reason() is None
    eagle = ("--method", "eagle", "--device", "cpu", "--dtype", "auto")
    assert draft_config(*eagle).dtype == ("float32" if kernel_runs and not amx else native)
    assert draft_config(*eagle, "--no-prepack").dtype == native  # no kernel without packing
    assert draft_config(*eagle, "--no-few-row-kernel").dtype == native
    assert draft_config("--method", "ngram", "--device", "cpu", "--dtype", "auto").dtype == native


def test_serve_lets_the_router_switch_speculation_off_where_it_loses() -> None:
    assert serve_args().adaptive_speculation
    assert not serve_args("--no-adaptive-speculation").adaptive_speculation


def test_serve_refuses_them_before_anything_starts(capsys: pytest.CaptureFixture) -> None:
    from splitspec import cli

    assert cli.main(["serve", "--draft-method", "off", "--topk", "2"]) == 2
    assert capsys.readouterr().err == (
        "error: --topk: no draft replica runs (--draft-method off); give --draft-method eagle or "
        "ngram, or leave them out\n"
    )
