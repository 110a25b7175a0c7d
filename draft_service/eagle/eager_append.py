"""The round's append run eagerly: any number of pairs, for appends past the append graphs'
buckets (prefills, long catch-ups) and on the CPU."""

from __future__ import annotations

import torch

from draft_service.eagle.head import EagleHead
from draft_service.eagle.pool import DraftKVPool
from draft_service.eagle.request_state import PairWork
from draft_service.eagle.rows import DraftRows
from model_runtime.attention import AttentionMetadata, build_metadata
from model_runtime.paged import PagedMetadata, for_sequences


def eager_bucket(num_pairs: int) -> int:
    """The pairs an eager append runs on CUDA: the next power of two, at least 16. Its padding
    pairs (the request table's padding row, writing the dummy slot) keep the matmuls to a few
    shapes, warmed up at start-up (factory.py): cuBLAS plans each new shape on the host. On
    the H200 (torch's profiler, 2026-12-03) the 7 matmuls of a 77-pair append of a new length
    took 3.9 ms of host time for 0.15 ms of device time in the whole append."""
    return max(16, 1 << (num_pairs - 1).bit_length())


def run_pairs_eagerly(
    head: EagleHead,
    pool: DraftKVPool,
    rows: DraftRows,
    work: list[PairWork],
    pad_to_bucket: bool,
    paged: bool = False,
) -> None:
    """One causal head forward over the work's pairs: their slots go into the requests' table
    rows, each request's last feature into the feature table. ``paged``: attention through
    the paged backend, which reads each pair's keys from its table row in place."""
    num_pairs = sum(w.count for w in work)
    pad = eager_bucket(num_pairs) - num_pairs if pad_to_bucket else 0
    device = rows.slots.device
    per_token = _per_token(work, pad, pool.dummy_slot, rows.pad_row).to(device)
    rows.slots.index_put_((per_token[3], per_token[1]), per_token[2])
    requests = [[w.start, w.count, w.state.row] for w in work]
    requests += [[0, pad, rows.pad_row]] if pad else []
    per_request = torch.tensor(requests).to(device)
    meta: PagedMetadata | AttentionMetadata
    if paged:
        meta = for_sequences(rows.slots, per_token[3], per_token[1], per_token[2], pool.dummy_slot)
    else:
        meta = build_metadata(
            write_slots=per_token[2],
            key_slots=rows.slots[per_request[:, 2], : max(s + n for s, n, _ in requests)],
            start_pos=per_request[:, 0],
            num_new=per_request[:, 1],
            num_query=max(count for _, count, _ in requests),
        )
    pending = [w.state.pending[: w.count] for w in work]
    hidden = torch.cat(pending + [pending[0].new_zeros(pad, pending[0].shape[1])]).to(device)
    out = head(per_token[0], hidden, per_token[1], pool.kv, meta)
    ends = per_request[:, 1].cumsum(0) - 1
    rows.features.index_copy_(0, per_request[:, 2], out[ends])


def _per_token(work: list[PairWork], pad: int, dummy_slot: int, pad_row: int) -> torch.Tensor:
    """[4, pairs + pad] on the host: token ids (pair t reads token t + 1), positions, write
    slots and table rows, so that they travel in one copy."""
    return torch.tensor(
        [
            [t for w in work for t in w.state.token_ids[w.start + 1 : w.start + w.count + 1]]
            + [0] * pad,
            [p for w in work for p in range(w.start, w.start + w.count)] + list(range(pad)),
            [s for w in work for s in w.slots] + [dummy_slot] * pad,
            [w.state.row for w in work for _ in range(w.count)] + [pad_row] * pad,
        ],
        dtype=torch.long,
    )
