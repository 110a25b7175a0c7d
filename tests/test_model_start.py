"""Loading a model for a service imports no torch._dynamo: the import took 1.4-2.2 s of CPU at
every target start on 2 cores (docs/cpu.md, "Start-up"). The model is made on the meta device,
and ops on meta tensors (a random init, the rotary tables' arithmetic) run torch's Python
reference ops, whose wrapper imports dynamo. A fresh interpreter, so no other test's imports
count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LOAD_THE_DEFAULT_MODEL = """
import sys
import torch
from model_runtime.loading import default_model_path, load_model
from plumbing.paths import default_cache_dir

model = load_model(default_model_path(), torch.float32, torch.device("cpu"), default_cache_dir())
assert model.rotary.cos.device.type == "cpu" and not model.model.embed_tokens.weight.is_meta
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo")))
"""


def test_loading_the_default_model_imports_no_dynamo() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOAD_THE_DEFAULT_MODEL],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout[:500]
