#!/usr/bin/env bash
# One device call that checks and times the GPU path without the default model (only the wheels
# of ../shared/docs/GPU.md travel): the GPU tests of the kernels, the decode and verify graph
# runners and both attention backends (on a tokenizer-free tiny model), then the in-process
# step times of the default model's shape and the Llama-3.1-8B shape (random weights: torch
# attention, paged, paged + merged layers, with decode and verify graphs), JSON under $OUT.
# The whole-stack checks (tests/test_gpu_stack.py, benchmarks.bench_gpu) need the GGUF too.
#   bash benchmarks/gpu_check.sh
set -u
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
nvidia-smi -L
timeout 280 python3 -m pytest -p no:cacheprovider -q tests/test_paged_attention.py \
  tests/test_layer_ops.py tests/test_fused_kernels.py tests/test_decode_graphs.py \
  tests/test_tree_kernels.py tests/test_verify_graphs.py tests/test_invariant_matmul.py \
  tests/test_exact_gpu.py 2>&1 | tail -30 | tee "$out/gpu_tests.log"
for shape in "smollm2-135m --context 256 --batches 1 8 32" "llama-8b --context 1024 --batches 1"; do
  timeout 200 python3 -m benchmarks.gpu_steps --shape $shape 2>&1 | tr '\r' '\n' \
    | grep '^{"shape"\|floor' | tee -a "$out/steps.jsonl"
done
