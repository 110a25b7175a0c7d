"""The whole stack on CUDA (default model, fp32, decode graphs and fused kernels on): greedy
output with EAGLE speculation equals target-only output, token for token. Skipped without a GPU.
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
    target = ["--device", "cuda", "--dtype", "float32"]
    drafts = [["--method", "eagle", "--device", "cuda", "--dtype", "bfloat16"]]
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
