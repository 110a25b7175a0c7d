#!/usr/bin/env bash
# The recipe of the shipped SmolLM2 head (draft_service/eagle/heads/smollm2-135m) on one GPU.
#
#   draft_service/eagle/train/gpu_run.sh GGUF PROMPT_BUNDLE RUN_DIR [RESULT_DIR]
#
# PROMPT_BUNDLE: `python -m splitspec.train_cli train-draft-prompts --with-replies --out F`.
# The shipped head ran as two sessions of one schedule-changing run: STEPS1 steps (the count a
# time limit had fitted), then --resume to STEPS (cosine restarted over the longer schedule).
# Session 2 reloads session 1's data instead of generating it again (it is deterministic: the
# shipped run generated it twice and got the same 3,497,546 tokens).
#
# With COMPARE=1 a third run trains on ShareGPT's recorded replies for STEPS1 steps and both
# runs are evaluated at STEPS1 on held-out prompts (NUM_EVAL, NUM_HUMANEVAL), for the
# self-distillation vs. fixed-replies comparison.
# Environment overrides (a dry run on CPU: DEVICE=cpu NUM_PROMPTS=6 MAX_NEW=16 STEPS1=4 STEPS=8):
# DEVICE, NUM_PROMPTS, MAX_NEW, EVAL_NEW, NUM_EVAL, NUM_HUMANEVAL, BATCH, STEPS1, STEPS, COMPARE.
set -euo pipefail
GGUF=$1 PROMPTS=$2 RUN=$3 RESULT=${4:-$3/result}
DEVICE=${DEVICE:-cuda} NUM_PROMPTS=${NUM_PROMPTS:-100000} MAX_NEW=${MAX_NEW:-384}
EVAL_NEW=${EVAL_NEW:-256} NUM_EVAL=${NUM_EVAL:-0} NUM_HUMANEVAL=${NUM_HUMANEVAL:-0}
BATCH=${BATCH:-32} STEPS1=${STEPS1:-1657} STEPS=${STEPS:-4000} COMPARE=${COMPARE:-0}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$RESULT"
common=(--model "$GGUF" --prompts "$PROMPTS" --device "$DEVICE" --cache-dir "$RUN/cache"
        --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW" --num-eval-prompts "$NUM_EVAL"
        --num-humaneval "$NUM_HUMANEVAL" --eval-max-new-tokens "$EVAL_NEW" --batch-size "$BATCH"
        --lr 1e-3 --warmup-steps 100 --num-unroll 3 --ce-rows 8192 --reg-weight 1.0
        --cls-weight 0.2 --step-decay 0.8 --seed 0 --log-every 50 --checkpoint-every 100000
        --generate-batch-tokens 1048576 --tf32 --quiet)

python3 -m splitspec.train_cli train-draft "${common[@]}" --out "$RUN/self" --self-distill \
    --steps "$STEPS1" --save-data "$RUN/data"
cp "$RUN/self/head/training.json" "$RESULT/session1_training.json"
python3 -m splitspec.train_cli train-draft "${common[@]}" --out "$RUN/self" --self-distill \
    --steps "$STEPS" --resume --data-dir "$RUN/data"
cp "$RUN/self/head/training.json" "$RUN/self/head/eagle_config.json" "$RESULT/"
# Results travel as files under 16 MiB: the fp32 weights in two parts (fc, layers).
python3 - "$RUN/self/head/model.safetensors" "$RESULT" <<'PY'
import sys
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
for part in ("fc", "layers"):
    save_file({k: v for k, v in state.items() if k.startswith(part + ".")},
              f"{sys.argv[2]}/head_{part}.safetensors")
PY
echo "self-distilled head done at ${SECONDS}s"

if (( COMPARE )); then
    python3 -m splitspec.train_cli train-draft "${common[@]}" --out "$RUN/sharegpt" \
        --sharegpt-replies --steps "$STEPS1"
    cp "$RUN/sharegpt/head/training.json" "$RESULT/sharegpt_training.json"
fi
echo "all done at ${SECONDS}s"
