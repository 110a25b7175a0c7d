"""HF transformers as the reference for greedy output, and the tie rule for comparing outputs.

Two correct fp32 engines may pick different tokens where the top two logits are (nearly) equal,
since batching and kernel order change the last bits. A difference is allowed only there: at the
first differing position HF's top-two logit gap must be below ``TIE_GAP``; it is then recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tests.helpers.prompts import GGUF_NAME, model_dir

TIE_GAP = 1e-2
EOS_ID = 2


@dataclass(frozen=True)
class TieCase:
    name: str
    position: int  # index into the completion of the first difference
    gap: float  # HF's top-1 minus top-2 logit there
    ours: int | None
    reference: int | None

    def __str__(self) -> str:
        return (
            f"{self.name}: outputs differ at completion token {self.position} "
            f"(ours {self.ours}, reference {self.reference}); HF top-2 gap {self.gap:.2e}"
        )


@dataclass(frozen=True)
class HFGeneration:
    token_ids: list[int]  # up to and including the first EOS
    gaps: list[float]  # top-2 logit gap at each generated position


class HFReference:
    """SmolLM2 through transformers, fp32 on CPU, loaded from the same GGUF on first use."""

    @cached_property
    def model(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        # One thread: on a shared 2-core box two OpenMP threads stall at every barrier while one
        # is descheduled; measured 2-5x slower than one thread under load, 1.6x faster idle.
        torch.set_num_threads(1)
        from model_runtime.hf_gguf import memoized_gguf_reads

        with memoized_gguf_reads():  # the same model, in ~40% of the time
            model = AutoModelForCausalLM.from_pretrained(
                model_dir(), gguf_file=GGUF_NAME, dtype=torch.float32
            )
        return model.eval()

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> HFGeneration:
        import torch

        ids = torch.tensor([list(prompt_ids)])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=EOS_ID,
                pad_token_id=EOS_ID,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0, ids.shape[1] :].tolist()
        if EOS_ID in tokens:
            tokens = tokens[: tokens.index(EOS_ID) + 1]
        gaps = [_top2_gap(step[0]) for step in out.logits[: len(tokens)]]
        return HFGeneration(tokens, gaps)

    def next_token_gap(self, context_ids: Sequence[int]) -> float:
        """Top-2 logit gap of the token that follows ``context_ids``."""
        import torch

        with torch.inference_mode():
            logits = self.model(torch.tensor([list(context_ids)])).logits[0, -1]
        return _top2_gap(logits)

    def gap_after(
        self, prompt_ids: Sequence[int], completion: Sequence[int]
    ) -> Callable[[int], float]:
        """For assert_same_greedy: the gap at completion position i, given the prompt."""
        return lambda i: self.next_token_gap([*prompt_ids, *completion[:i]])


def _top2_gap(logits: Any) -> float:
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_same_greedy(
    name: str,
    ours: Sequence[int],
    reference: Sequence[int],
    gap_at: Callable[[int], float],
    ties: list[TieCase],
) -> None:
    """``ours == reference``, or they first differ where HF's top-two gap is below TIE_GAP."""
    i = first_difference(ours, reference)
    if i is None:
        return
    gap = gap_at(i)
    case = TieCase(name, i, gap, _at(ours, i), _at(reference, i))
    assert gap < TIE_GAP, (
        f"{case}: not a tie (>= {TIE_GAP})\n  ours      {list(ours)}\n  reference {list(reference)}"
    )
    print(f"tie case: {case}")
    ties.append(case)


def _at(ids: Sequence[int], i: int) -> int | None:
    return ids[i] if i < len(ids) else None
