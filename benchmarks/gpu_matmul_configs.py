"""The batch-invariant matmul (kernels/invariant_matmul.py) against cuBLAS on a GPU, per column
tile and reduction split, on the linear layers of the default model and the Llama-3.1-8B shape:
kernel time (20 calls replayed from one CUDA graph, so launches do not count) and whether a row
alone has the bits it has among 16 and 256 rows. JSON lines on stdout.

  python -m benchmarks.gpu_matmul_configs
"""

from __future__ import annotations

import json

import torch

from kernels import invariant_matmul as im

# (name, N, K) of each linear, q|k|v and gate|up merged as the target runs them.
LAYERS = {
    "smollm2-135m": [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576),
                     ("down", 576, 1536)],
    "llama-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                 ("down", 4096, 14336)],
}  # fmt: skip
BLOCK_NS = (32, 64, 128)
SPLITS = (1, 2, 4, 8)
CALLS = 20


def graph_us(fn) -> float:
    """Mean µs of one call, from a graph of CALLS calls replayed 5 times."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * CALLS)


def invariant(w: torch.Tensor, x: torch.Tensor, block_n: int, splits: int | None) -> bool:
    alone = im.matmul(x[:1], w, block_n, splits)
    return all(
        torch.equal(im.matmul(x[:rows], w, block_n, splits)[:1], alone) for rows in (16, 256)
    )


def layer_rows(shape: str, name: str, cols: int, inner: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(cols)
    w = torch.randn(cols, inner, device="cuda", generator=gen).to(torch.bfloat16) * 0.02
    x = torch.randn(256, inner, device="cuda", generator=gen).to(torch.bfloat16)
    base = {"shape": shape, "layer": name, "N": cols, "K": inner}
    rows = []
    for m in (1, 16):
        xm = x[:m].contiguous()
        cublas = graph_us(lambda xm=xm: xm @ w.T)
        for block_n in BLOCK_NS:
            for splits in (None, *SPLITS):
                us = graph_us(lambda xm=xm, b=block_n, s=splits: im.matmul(xm, w, b, s))
                default = splits is None
                row = {**base, "M": m, "block_n": block_n, "splits": "default" if default
                       else splits, "us": round(us, 2), "cublas_us": round(cublas, 2)}  # fmt: skip
                if m == 1:
                    row["invariant"] = invariant(w, x, block_n, splits)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    for shape, layers in LAYERS.items():
        for name, cols, inner in layers:
            layer_rows(shape, name, cols, inner)


if __name__ == "__main__":
    main()
