"""Target-only phase of the GPU benchmark (benchmarks/bench_gpu.py runs it): tok/s through
router + target processes at each batch size, per target variant (backend, graphs, multi-step)."""

from __future__ import annotations

from benchmarks.gpu_stack import server_status, stack, step_timing, throughput
from splitspec.client import Client

# name: (attention backend, decode graphs, target --decode-steps; None = the target's default).
VARIANTS = {
    "paged": ("paged", True, None),
    "paged-one-step": ("paged", True, 1),
    "torch": ("torch", True, None),
    "eager": ("torch", False, None),
}


def phase(
    prompts: list[list[int]], max_new: int, batches: list[int], names: list[str]
) -> list[dict]:

    rows = []
    for name in names:
        attention, graphs, steps = VARIANTS[name]
        extra = [] if steps is None else ["--decode-steps", str(steps)]
        with stack("bfloat16", drafter=False, graphs=graphs, attention=attention,
                   target_extra=extra) as s:  # fmt: skip
            client = Client(s.router_address)
            throughput(client, prompts[:2], 1, 16)  # warm-up
            for batch in batches if graphs else [1]:
                count = batch if batch > 1 else (8 if graphs else 2)  # eager is slow: 2 prompts
                before = step_timing(client)
                row, _ = throughput(client, prompts[:count], batch, max_new)
                row["step_timing_ms"] = step_timing(client, before)
                row["decode_steps"] = server_status(client).decode_steps  # multi-step K
                rows.append({"variant": name, "attention": attention, "graphs": graphs, **row})
                print(f"target-only {name} batch {batch}: {row['tok_s']:.1f} tok/s")
            client.close()
    return rows
