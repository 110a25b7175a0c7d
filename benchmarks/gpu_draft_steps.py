"""In-process times of an EAGLE draft round on a GPU: the append of a round's accepted tokens
and hidden rows (one head forward over the new pairs) and the propose (the tree search), with
the search eager and replayed from CUDA graphs, for a head of the default model's shape with
random weights (the shipped head's shape: one decoder layer, its hot vocabulary size). Each
round reports its wall time (what the draft service's work would be) beside the device's time
on its kernels (model_runtime/device_clock.py): the difference is host work.

  python -m benchmarks.gpu_draft_steps [--batches 1 4 16] [--context 256] [--trees 5,4,16 8,8,64]
                                      [--no-eager] [--profile]
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


def round_times(
    head: EagleHead,
    shape: TreeShape,
    batch: int,
    context: int,
    graphs: bool,
    rounds: int = 30,
    profile: bool = False,
) -> dict:
    drafter = EagleDrafter(head, shape, num_slots=batch * (context + rounds * 8) + 64)
    if graphs:
        attach_graphs(drafter)
    hidden = head.hidden_size
    rids = [f"r{i}" for i in range(batch)]
    rows = torch.randn(context, hidden, dtype=head.fc.weight.dtype)  # on the host, as a message's
    drafter.append_many([ContextChunk(r, 0, list(range(1, context + 2)), 0, rows) for r in rids])
    drafter.take_device_ms()
    wall_ms, device_ms = [], []
    for n in range(rounds):
        start = context + 1 + n * ACCEPTED
        new_rows = torch.randn(ACCEPTED, hidden, dtype=rows.dtype)
        chunks = [
            ContextChunk(r, start, [7] * ACCEPTED, start - 1, new_rows) for r in rids
        ]  # fmt: skip
        began = time.perf_counter()
        drafter.append_many(chunks)
        drafter.propose(rids)  # ends in the device->host read of the trees
        wall_ms.append((time.perf_counter() - began) * 1e3)
        device_ms.append(drafter.take_device_ms())
    row = {
        "tree": [shape.num_steps, shape.topk, shape.num_draft_tokens],
        "batch": batch,
        "graphs": graphs,
        "round_ms": statistics.median(wall_ms[5:]),
        "device_ms": statistics.median(device_ms[5:]),
    }
    if profile:  # the kernels of three more rounds, by device time
        from benchmarks.gpu_profile import top_kernels

        start = context + 1 + rounds * ACCEPTED
        row["kernels"] = top_kernels(lambda: [
            (drafter.append_many([ContextChunk(r, start + n * ACCEPTED, [7] * ACCEPTED,
                                               start + n * ACCEPTED - 1, new_rows) for r in rids]),
             drafter.propose(rids)) for n in range(3)
        ], count=30)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--trees", nargs="+", default=["5,4,16", "8,8,64"])
    parser.add_argument("--no-eager", action="store_true", help="graphs only")
    parser.add_argument("--profile", action="store_true", help="the kernels of three rounds")
    args = parser.parse_args()
    prefer_efficient_attention()
    use_fused_kernels(True)
    head = random_head(torch.bfloat16)
    shapes = [TreeShape(*map(int, tree.split(","))) for tree in args.trees]
    with torch.inference_mode():
        for graphs in (True,) if args.no_eager else (False, True):
            for shape in shapes:
                for batch in args.batches:
                    row = round_times(
                        head, shape, batch, args.context, graphs, profile=args.profile
                    )
                    print(json.dumps({"shape": "smollm2-135m eagle head", **row}), flush=True)


if __name__ == "__main__":
    main()
