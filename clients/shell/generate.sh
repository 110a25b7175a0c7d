#!/usr/bin/env bash
# Streams a completion from a splitspec router from the shell, through server reflection only.
#   clients/shell/generate.sh [OPTIONS] HOST:PORT "prompt" [max_tokens]
# Options, as `splitspec generate` names them:
#   --tls-ca FILE            the router serves TLS: trust this CA
#   --tls-client-cert FILE   with --tls-client-key: present this certificate (a router that
#   --tls-client-key FILE      wants client certificates, mTLS)
#   --api-key-env VAR        the environment variable holding the router's API key, sent
#                            when set (default: SPLITSPEC_API_KEY)
# With grpcurl installed the same call is:
#   grpcurl -plaintext HOST:PORT list
#   grpcurl -plaintext -d '{"messages": {"items": [{"role": "user", "content": "Hi"}]},
#     "sampling": {"maxNewTokens": 32, "temperature": 0}}' HOST:PORT splitspec.v1.Generation/Generate
# (-cacert, -cert, -key and -H "authorization: Bearer KEY" for the options above.)
# Without it, a Python client that also learns the API by reflection stands in.
set -euo pipefail
usage="usage: generate.sh [--tls-ca FILE] [--tls-client-cert FILE --tls-client-key FILE] \
[--api-key-env VAR] HOST:PORT PROMPT [MAX_TOKENS]"
ca="" cert="" key="" key_env=SPLITSPEC_API_KEY
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --tls-ca | --tls-client-cert | --tls-client-key | --api-key-env) ;;
    *) echo "unknown option $1; $usage" >&2; exit 2 ;;
  esac
  [[ $# -ge 2 ]] || { echo "$1 needs a value; $usage" >&2; exit 2; }
  case $1 in
    --tls-ca) ca=$2 ;;
    --tls-client-cert) cert=$2 ;;
    --tls-client-key) key=$2 ;;
    --api-key-env) key_env=$2 ;;
  esac
  shift 2
done
address=${1:?$usage}
prompt=${2:?$usage}
max_tokens=${3:-64}
if [[ -n $cert$key && ( -z $cert || -z $key || -z $ca ) ]]; then
  echo "--tls-client-cert and --tls-client-key go together, with --tls-ca; $usage" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
if command -v grpcurl >/dev/null 2>&1 && [[ -z "${SPLITSPEC_NO_GRPCURL:-}" ]]; then
  flags=(-plaintext)
  [[ -n $ca ]] && flags=(-cacert "$ca")
  [[ -n $cert ]] && flags+=(-cert "$cert" -key "$key")
  [[ -n ${!key_env:-} ]] && flags+=(-H "authorization: Bearer ${!key_env}")
  grpcurl "${flags[@]}" "$address" list
  echo ---
  grpcurl "${flags[@]}" -d "$(printf '{"messages": {"items": [{"role": "user", "content": %s}]}, "sampling": {"maxNewTokens": %d, "temperature": 0}}' \
    "$("${PYTHON:-python3}" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$prompt")" "$max_tokens")" \
    "$address" splitspec.v1.Generation/Generate
else
  flags=()
  [[ -n $ca ]] && flags+=(--tls-ca "$ca")
  [[ -n $cert ]] && flags+=(--tls-client-cert "$cert" --tls-client-key "$key")
  flags+=(--api-key-env "$key_env")
  exec "${PYTHON:-python3}" "$here/reflection_generate.py" "${flags[@]}" "$address" "$prompt" \
    --max-tokens "$max_tokens"
fi
