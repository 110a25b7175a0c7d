"""Compile the tree kernels for a CUDA target with no GPU present: Triton's compiler and ptxas.

The CPU tests run the kernels under Triton's interpreter, which does not check what only the
compiler checks (a loop-carried value that changes dtype, an op with no lowering). This compiles
each kernel, with the argument types the wrappers pass, to a cubin for sm_90 (the H200), so CI
catches those on a machine without CUDA. Prints one line per kernel variant:

    python -m kernels.tree_compile_check [--arch 90]
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import tree_compact, tree_kernels

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


def compile_all(arch: int = 90) -> list[str]:
    if tree_kernels.INTERPRETED:
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter compiles nothing")
    target = GPUTarget("cuda", arch, 32)
    lines = []
    for label, kernel, signature, constexprs, warps in variants():
        source = ASTSource(
            fn=kernel,
            signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
            constexprs=constexprs,
        )
        compiled = triton.compile(source, target=target, options={"num_warps": warps})
        lines.append(f"{label}: sm_{arch} cubin {len(compiled.asm['cubin'])} bytes")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="Triton tree kernels vs torch reference, CUDA")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    for line in compile_all(parser.parse_args().arch):
        print(line)


if __name__ == "__main__":
    main()
