#!/usr/bin/env bash
# One device call that checks and times the GPU path (see ../shared/docs/GPU.md for getting the
# wheels and the model onto the box first): the GPU tests of the kernels, the graph runner and
# both attention backends, then the in-process step benchmark of the default model's shape and
# the Llama-3.1-8B shape (torch attention, paged, paged + merged layers), JSON under $OUT.
#   bash benchmarks/gpu_check.sh PROMPTS.json
set -u
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
nvidia-smi -L
timeout 280 python3 -m pytest -p no:cacheprovider -q tests/test_paged_attention.py \
  tests/test_layer_ops.py tests/test_fused_kernels.py tests/test_decode_graphs.py \
  tests/test_tree_kernels.py 2>&1 | tail -30 | tee "$out/gpu_tests.log"
timeout 280 python3 -m benchmarks.bench_gpu --prompts "$1" --out "$out/steps.json" --only steps \
  2>&1 | grep -v '^ *\[' | tail -60
