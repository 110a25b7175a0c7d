"""Compile the Triton kernels for a CUDA target with no GPU present: Triton's compiler and ptxas.

The CPU tests run the kernels under Triton's interpreter, which does not check what only the
compiler checks (a loop-carried value that changes dtype, an op with no lowering). This compiles
each kernel, with the argument types the wrappers pass, to a cubin for sm_90 (the H200), so CI
catches those on a machine without CUDA. Prints one line per kernel variant:

    python -m kernels.compile_check [--arch 90]

Covered: the tree kernels, the fused ops, the paged attention and the merged layer kernels.
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import (
    dot_modes,
    fused_ops,
    invariant_matmul,
    layer_ops,
    paged_attention,
    tree_compact,
    tree_kernels,
)

MASK = {
    "parents_ptr": "*i64",
    "valid_ptr": "*u8",
    "start_ptr": "*i64",
    "anc_ptr": "*u8",
    "depth_ptr": "*i64",
    "pos_ptr": "*i64",
    "num_nodes": "i32",
}
GREEDY = {
    "tokens_ptr": "*i64",
    "parents_ptr": "*i64",
    "valid_ptr": "*u8",
    "next_ptr": "*i64",
    "path_ptr": "*i64",
    "accepted_ptr": "*i64",
    "bonus_ptr": "*i64",
    "num_nodes": "i32",
}


def compact_signature(word: str, slots: str) -> dict[str, str]:
    return {
        "base_ptr": word,
        "table_ptr": "*i64",
        "slots_ptr": slots,
        "path_ptr": "*i64",
        "num_nodes": "i32",
    }


def variants() -> list[tuple[str, object, dict[str, str], dict[str, int], int]]:
    """(label, kernel, signature, constexprs, num_warps) for the shapes the wrappers launch."""
    found: list[tuple[str, object, dict[str, str], dict[str, int], int]] = []
    for nodes in (16, 64):
        block_i = min(nodes, tree_kernels.MASK_TILE // nodes)
        found.append(
            (
                f"mask N={nodes}",
                tree_kernels._tree_mask_kernel,
                MASK,
                {"BLOCK_I": block_i, "BLOCK_N": nodes},
                tree_compact.warps_for(block_i * nodes),
            )
        )
        found.append(
            (
                f"greedy N={nodes}",
                tree_kernels._greedy_path_kernel,
                GREEDY,
                {"BLOCK_N": nodes},
                tree_compact.warps_for(nodes),
            )
        )
    for cols, word, slots in ((512, "*i64", "*i64"), (64, "*i16", "*i32")):
        found.append(
            (
                f"compact {cols} cols words {word} slots {slots}",
                tree_compact._compact_kernel,
                compact_signature(word, slots),
                {"BLOCK_J": tree_compact.PATH_ROUND, "BLOCK_C": cols},
                tree_compact.warps_for(tree_compact.PATH_ROUND * cols),
            )
        )
    return found


def ptrs(kind: str, *names: str) -> dict[str, str]:
    return {name: kind for name in names}


def model_variants() -> list[tuple[str, object, dict[str, str], dict[str, int], int]]:
    """The decoder's kernels in bf16 (fp32 lowers the same ops), for the default model's and
    the 8B's shapes."""
    found: list[tuple[str, object, dict[str, str], dict[str, int], int]] = []
    for word in ("*bf16",):
        for group, head_dim in ((3, 64), (4, 128)):
            chunk = {
                **ptrs(word, "q_ptr", "k_ptr", "v_ptr"),
                **ptrs("*fp32", "m_ptr", "l_ptr", "acc_ptr"),
                **ptrs("*i64", "table_ptr", "row_ptr", "len_ptr", "prefix_ptr", "path_ptr"),
                **ptrs("i32", "stride_qt", "stride_qh", "stride_ks", "stride_kh",
                       "stride_table", "stride_path", "num_tokens", "num_heads", "num_chunks",
                       "tile_tokens", "spread"),
                "scale": "fp32",
            }  # fmt: skip
            block_g = triton.next_power_of_2(group)
            constexprs = {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_D": head_dim,
                          "BLOCK_G": block_g, "TILE": paged_attention.tokens_per_tile(group),
                          "BLOCK_K": paged_attention.BLOCK_K, "CHUNK": paged_attention.CHUNK,
                          "DOT": dot_modes.NATIVE}  # fmt: skip
            found.append((f"paged attention chunks {word} group {group} dim {head_dim}",
                          paged_attention._chunk_kernel, chunk, constexprs, 4))
            merge = {**ptrs("*fp32", "m_ptr", "l_ptr", "acc_ptr"), "out_ptr": word,
                     "len_ptr": "*i64",
                     **ptrs("i32", "stride_ot", "stride_oh", "num_heads", "num_chunks")}
            found.append((f"paged attention merge {word} dim {head_dim}",
                          paged_attention._merge_kernel, merge,
                          {"HEAD_DIM": head_dim, "BLOCK_D": head_dim,
                           "CHUNK": paged_attention.CHUNK}, 4))
            rope = {**ptrs(word, "qkv_ptr", "cos_ptr", "sin_ptr"), "slots_ptr": "*i64",
                    **ptrs(word, "q_ptr", "k_pool_ptr", "v_pool_ptr"),
                    **ptrs("i32", "stride_qkv", "stride_cos", "stride_q", "stride_pool")}
            heads = {"NUM_HEADS": 3 * group, "NUM_KV_HEADS": 3, "HALF": head_dim // 2}
            found.append((f"rope+store {word} dim {head_dim}",
                          layer_ops._rope_and_store_kernel, rope, heads, 4))
        norm = {**ptrs(word, "x_ptr", "res_ptr", "w_ptr", "normed_ptr", "sum_ptr"),
                "n_cols": "i32", "eps": "fp32"}
        found.append((f"add+rmsnorm {word}", layer_ops._add_rms_norm_kernel, norm,
                      {"BLOCK": 1024}, 4))
        halves = {**ptrs(word, "x_ptr", "out_ptr"), "n": "i32", "width": "i32"}
        found.append((f"silu*mul halves {word}", layer_ops._silu_mul_halves_kernel, halves,
                      {"BLOCK": 1024}, 4))
        for block_n in (32, 64):  # the two column tiles invariant_matmul.config_for picks
            matmul = {**ptrs(word, "x_ptr", "w_ptr", "out_ptr"),
                      **ptrs("i32", "M", "N", "K", "k_per_split", "stride_xm", "stride_wn",
                             "stride_om", "stride_os")}
            tiles = {"BLOCK_M": invariant_matmul.BLOCK_M, "BLOCK_N": block_n,
                     "BLOCK_K": invariant_matmul.BLOCK_K, "DOT": dot_modes.NATIVE}
            found.append((f"invariant matmul {word} N-tile {block_n}",
                          invariant_matmul._matmul_kernel, matmul, tiles, 4))
        sums = {"part_ptr": "*fp32", "out_ptr": word, "numel": "i32", "num_splits": "i32"}
        found.append((f"invariant matmul's split sum {word}", invariant_matmul._sum_splits_kernel,
                      sums, {"BLOCK": 1024}, 4))
        plain_norm = {**ptrs(word, "x_ptr", "w_ptr", "out_ptr"),
                      **ptrs("i32", "stride_x", "stride_out", "n_cols"), "eps": "fp32"}
        found.append((f"rmsnorm {word}", fused_ops._rms_norm_kernel, plain_norm,
                      {"BLOCK": 1024}, 4))
    return found  # fmt: skip


def compile_all(arch: int = 90) -> list[str]:
    if tree_kernels.INTERPRETED:
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter compiles nothing")
    target = GPUTarget("cuda", arch, 32)
    lines = []
    for label, kernel, signature, constexprs, warps in variants() + model_variants():
        source = ASTSource(
            fn=kernel,
            signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
            constexprs=constexprs,
        )
        compiled = triton.compile(source, target=target, options={"num_warps": warps})
        lines.append(f"{label}: sm_{arch} cubin {len(compiled.asm['cubin'])} bytes")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="compile every Triton kernel for a CUDA target")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    for line in compile_all(parser.parse_args().arch):
        print(line)


if __name__ == "__main__":
    main()
