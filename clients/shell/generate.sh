#!/usr/bin/env bash
# Streams a completion from a splitspec router from the shell, through server reflection only.
#   clients/shell/generate.sh HOST:PORT "prompt" [max_tokens]
# With grpcurl installed the same call is:
#   grpcurl -plaintext HOST:PORT list
#   grpcurl -plaintext -d '{"messages": {"items": [{"role": "user", "content": "Hi"}]},
#     "sampling": {"maxNewTokens": 32, "temperature": 0}}' HOST:PORT splitspec.v1.Generation/Generate
# Without it, a Python client that also learns the API by reflection stands in.
set -euo pipefail
address=${1:?usage: generate.sh HOST:PORT PROMPT [MAX_TOKENS]}
prompt=${2:?usage: generate.sh HOST:PORT PROMPT [MAX_TOKENS]}
max_tokens=${3:-64}
here=$(cd "$(dirname "$0")" && pwd)
if command -v grpcurl >/dev/null 2>&1 && [[ -z "${SPLITSPEC_NO_GRPCURL:-}" ]]; then
  grpcurl -plaintext "$address" list
  echo ---
  grpcurl -plaintext -d "$(printf '{"messages": {"items": [{"role": "user", "content": %s}]}, "sampling": {"maxNewTokens": %d, "temperature": 0}}' \
    "$("${PYTHON:-python3}" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$prompt")" "$max_tokens")" \
    "$address" splitspec.v1.Generation/Generate
else
  exec "${PYTHON:-python3}" "$here/reflection_generate.py" "$address" "$prompt" --max-tokens "$max_tokens"
fi
