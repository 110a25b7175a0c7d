"""In-process times of an EAGLE draft round on a GPU: the append of a round's accepted tokens
and hidden rows (one head forward over the new pairs) and the propose (the tree search), with
the search eager and replayed from CUDA graphs, for a head of the default model's shape with
random weights (the shipped head's shape: one decoder layer, its hot vocabulary size).

  python -m benchmarks.gpu_draft_steps [--batches 1 4 16] [--context 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.gpu_steps import model_config
from draft_service.drafter import ContextChunk, TreeShape
from draft_service.eagle.drafter import EagleDrafter
from draft_service.eagle.factory import attach_graphs
from draft_service.eagle.head import EagleConfig, EagleHead
from model_runtime.cuda_setup import prefer_efficient_attention
from model_runtime.fused import use_fused_kernels

ACCEPTED = 4  # tokens a round appends per request (about the measured acceptance)
HOT_VOCAB = 8192


def random_head(dtype: torch.dtype) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(target=model_config("smollm2-135m")))
    head.init_trainable(seed=0)
    head = head.to("cuda", dtype).eval()
    head.set_hot_vocab(torch.randperm(head.config.target.vocab_size)[:HOT_VOCAB])
    return head


def round_times(head: EagleHead, batch: int, context: int, graphs: bool, rounds: int = 30):
    drafter = EagleDrafter(head, TreeShape(), num_slots=batch * (context + rounds * 8) + 64)
    if graphs:
        attach_graphs(drafter)
    hidden = head.hidden_size
    rids = [f"r{i}" for i in range(batch)]
    rows = torch.randn(context, hidden, device="cuda", dtype=head.fc.weight.dtype)
    drafter.append_many([ContextChunk(r, 0, list(range(1, context + 2)), 0, rows) for r in rids])
    append_ms, propose_ms = [], []
    for n in range(rounds):
        start = context + 1 + n * ACCEPTED
        new_rows = torch.randn(ACCEPTED, hidden, device="cuda", dtype=rows.dtype)
        chunks = [
            ContextChunk(r, start, [7] * ACCEPTED, start - 1, new_rows) for r in rids
        ]  # fmt: skip
        began = time.perf_counter()
        drafter.append_many(chunks)
        torch.cuda.synchronize()
        appended = time.perf_counter()
        drafter.propose(rids)  # ends in the device->host read of the trees
        append_ms.append((appended - began) * 1e3)
        propose_ms.append((time.perf_counter() - appended) * 1e3)
    return {
        "batch": batch,
        "graphs": graphs,
        "append_ms": statistics.median(append_ms[5:]),
        "propose_ms": statistics.median(propose_ms[5:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    prefer_efficient_attention()
    use_fused_kernels(True)
    head = random_head(torch.bfloat16)
    with torch.inference_mode():
        for graphs in (False, True):
            for batch in args.batches:
                row = round_times(head, batch, args.context, graphs)
                print(json.dumps({"shape": "smollm2-135m eagle head", **row}), flush=True)


if __name__ == "__main__":
    main()
