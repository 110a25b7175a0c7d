"""The whole stack on CUDA (default model, decode graphs and fused kernels on): output with
EAGLE speculation equals target-only output, token for token: greedy in fp32 with the drafter
on the GPU and with it on the CPU beside a GPU target (mixed placement), and seeded sampling in
bf16 under --exact. Skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from splitspec.client import build_request
from splitspec.launcher import LocalStack
from tests.helpers.rpc import Router

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function that reverses a linked list.",
    "List five uses of a paperclip.",
]


FP32 = ["--device", "cuda", "--dtype", "float32"]


def test_fp32_speculation_equals_target_only_on_cuda(tmp_path) -> None:
    _speculation_equals_target_only(tmp_path, FP32, "cuda")


def test_a_cpu_drafter_serves_a_cuda_target(tmp_path) -> None:
    """The draft replica on the CPU takes the GPU target's hidden rows (fp32 off the device)."""
    _speculation_equals_target_only(tmp_path, FP32, "cpu")


def test_exact_bf16_seeded_sampling_equals_target_only_on_cuda(tmp_path) -> None:
    """Under --exact a verify's logits are a decode step's bit for bit, and a verify accepts a
    draft only where it is target-only's own keyed draw (target_service/verify.py): a seeded
    sampled request draws the same tokens with speculation as without."""
    exact = ["--device", "cuda", "--dtype", "bfloat16", "--exact"]
    _speculation_equals_target_only(tmp_path, exact, "cuda", temperature=0.8)


def _speculation_equals_target_only(
    tmp_path, target: list[str], draft_device: str, temperature: float = 0.0
) -> None:
    drafts = [["--method", "eagle", "--device", draft_device, "--dtype", "bfloat16"]]
    with LocalStack(target, [], log_dir=tmp_path, draft_args=drafts) as stack:
        router = Router(stack.router_address)
        for seed, prompt in enumerate(PROMPTS):
            outputs = [
                router.generate(
                    build_request(prompt, True, 96, temperature, seed=seed, speculate=spec)
                ).token_ids
                for spec in (True, False)
            ]
            assert len(outputs[1]) > 0 and outputs[0] == outputs[1], prompt
        status = router.status()
        router.close()
    assert status.speculation.accepted_tokens > 0  # speculation ran and accepted drafts
    assert "captured" in (tmp_path / "target.log").read_text()  # the decode graphs were on
