#!/usr/bin/env bash
# The recipe of the shipped SmolLM2 head (draft_service/eagle/heads/smollm2-135m) on one GPU.
#
#   draft_service/eagle/train/gpu_run.sh GGUF PROMPT_BUNDLE RUN_DIR [RESULT_DIR]
#
# PROMPT_BUNDLE: `python -m splitspec.train_cli train-draft-prompts --all-turns --stdlib-code
# --out F` (every user turn of the training conversations with its history, up to 768 tokens,
# then HumanEval-style code stubs from their Python functions and the standard library's).
# One train-draft command: self-distilled replies and features, then STEPS steps on one cosine
# schedule. TRAIN_UNTIL (seconds after the start; 0: off) shrinks the schedule after 150 timed
# steps so that it still ends in time. The shipped run asked for STEPS=20000 TRAIN_UNTIL=1440,
# which an H200 fitted to 16,387 steps; the default below is that count, without a time limit.
#
# Environment overrides (a dry run on CPU: DEVICE=cpu NUM_PROMPTS=6 MAX_NEW=16 STEPS=8 BATCH=2):
# DEVICE, NUM_PROMPTS, MAX_NEW, BATCH, STEPS, SNAPSHOTS, TRAIN_UNTIL.
set -euo pipefail
GGUF=$1 PROMPTS=$2 RUN=$3 RESULT=${4:-$3/result}
DEVICE=${DEVICE:-cuda} NUM_PROMPTS=${NUM_PROMPTS:-100000} MAX_NEW=${MAX_NEW:-384}
BATCH=${BATCH:-32} STEPS=${STEPS:-16387} SNAPSHOTS=${SNAPSHOTS:-2000,5000,10000}
TRAIN_UNTIL=${TRAIN_UNTIL:-0}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$RESULT"
limit=()
if (( TRAIN_UNTIL )); then limit=(--train-until "$TRAIN_UNTIL" --fit-steps-to-time); fi

python3 -m splitspec.train_cli train-draft --model "$GGUF" --prompts "$PROMPTS" \
    --device "$DEVICE" --cache-dir "$RUN/cache" --out "$RUN/self" --self-distill \
    --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW" --num-eval-prompts 0 \
    --num-humaneval 0 --batch-size "$BATCH" --max-seq-len 1152 --steps "$STEPS" \
    --lr 1e-3 --warmup-steps 100 --num-unroll 3 --ce-rows 8192 --reg-weight 1.0 \
    --cls-weight 0.2 --step-decay 0.8 --seed 0 --log-every 250 --checkpoint-every 1000 \
    --snapshot-at "$SNAPSHOTS" --generate-batch-tokens 1048576 --tf32 --quiet "${limit[@]}"

head=$RUN/self/head
cp "$head/training.json" "$head/eagle_config.json" "$head/token_counts.safetensors" "$RESULT/"
cp "$RUN"/self/checkpoints/head-*.safetensors "$RESULT/" 2>/dev/null || true
# Results travel as files under 16 MiB: the fp32 weights in two parts (fc, layers).
python3 - "$head/model.safetensors" "$RESULT" <<'PY'
import sys
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
for part in ("fc", "layers"):
    save_file({k: v for k, v in state.items() if k.startswith(part + ".")},
              f"{sys.argv[2]}/head_{part}.safetensors")
PY
echo "done at ${SECONDS}s"
