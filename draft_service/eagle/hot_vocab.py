"""Choose a head's reduced ("hot") draft vocabulary from token counts, FR-Spec style.

On a CPU the draft step's cost is dominated by projecting each frontier feature onto the whole
49k vocabulary; projecting onto the few thousand tokens that make up almost all of the text the
target writes is several times cheaper and loses little acceptance (a draft outside the hot set
was rarely going to be accepted). The target still verifies against its full distribution, so
outputs are unchanged whatever the set.

    python -m draft_service.eagle.hot_vocab --counts token_counts.safetensors --size 8192 \\
        --head draft_service/eagle/heads/smollm2-135m
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import torch

from draft_service.eagle.head import HOT_VOCAB_FILE


def hot_token_ids(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most counted token ids (ties: lower id first) plus ``always``, sorted.

    ``always`` holds tokens that must stay draftable however rare they are in the counts (the
    end-of-turn token: a draft that ends the reply is accepted whenever the target stops).
    """
    if counts.dim() != 1 or size < 1:
        raise ValueError("counts must be one count per token id and size >= 1")
    forced = sorted({int(t) for t in always})
    if any(not 0 <= t < counts.numel() for t in forced):
        raise ValueError(f"an always-kept id is outside the vocabulary of {counts.numel()}")
    order = torch.sort(counts.to(torch.int64), descending=True, stable=True).indices
    chosen = set(forced)
    for token in order.tolist():
        if len(chosen) >= max(size, len(forced)):
            break
        chosen.add(token)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(counts: torch.Tensor, token_ids: torch.Tensor) -> float:
    """Fraction of all counted tokens that fall inside ``token_ids``."""
    total = int(counts.sum())
    return float(counts[token_ids].sum()) / total if total else 0.0


def write_hot_vocab(head_dir: Path, token_ids: torch.Tensor) -> Path:
    from safetensors.torch import save_file

    path = head_dir / HOT_VOCAB_FILE
    save_file({"token_ids": token_ids.to(torch.long).contiguous()}, path)
    return path


def read_counts(path: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(path)["counts"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=Path, required=True, help="safetensors with 'counts'")
    parser.add_argument("--size", type=int, required=True, help="tokens the draft may propose")
    parser.add_argument("--head", type=Path, required=True, help="head folder to write into")
    parser.add_argument(
        "--always",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="comma-separated ids always kept (e.g. the end-of-turn id)",
    )
    args = parser.parse_args(argv)
    counts = read_counts(args.counts)
    ids = hot_token_ids(counts, args.size, args.always)
    path = write_hot_vocab(args.head, ids)
    report = {"size": int(ids.numel()), "coverage": round(coverage(counts, ids), 5)}
    print(json.dumps({"written": str(path), **report}))


if __name__ == "__main__":
    main()
