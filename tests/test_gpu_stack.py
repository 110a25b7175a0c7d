"""The whole stack on CUDA (default model, fp32, decode graphs and fused kernels on): greedy
output with EAGLE speculation equals target-only output, token for token, with the drafter on
the GPU and with it on the CPU beside a GPU target (mixed placement). Skipped without a GPU.
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


def test_fp32_speculation_equals_target_only_on_cuda(tmp_path) -> None:
    _speculation_equals_target_only(tmp_path, "cuda")


def test_a_cpu_drafter_serves_a_cuda_target(tmp_path) -> None:
    """The draft replica on the CPU takes the GPU target's hidden rows (fp32 off the device)."""
    _speculation_equals_target_only(tmp_path, "cpu")


def _speculation_equals_target_only(tmp_path, draft_device: str) -> None:
    target = ["--device", "cuda", "--dtype", "float32"]
    drafts = [["--method", "eagle", "--device", draft_device, "--dtype", "bfloat16"]]
    with LocalStack(target, [], log_dir=tmp_path, draft_args=drafts) as stack:
        router = Router(stack.router_address)
        for prompt in PROMPTS:
            outputs = [
                router.generate(build_request(prompt, True, 96, 0.0, speculate=spec)).token_ids
                for spec in (True, False)
            ]
            assert len(outputs[1]) > 0 and outputs[0] == outputs[1], prompt
        status = router.status()
        router.close()
    assert status.speculation.accepted_tokens > 0  # speculation ran and accepted drafts
    assert "captured" in (tmp_path / "target.log").read_text()  # the decode graphs were on
