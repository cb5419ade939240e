# vllm-patch: `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LINE ?=
SERIES_ARGS ?= $(if $(LINE),--line $(LINE))
# The chosen line's series directory (LINE empty or `current`: the top-level one) and its pinned release.
LINE_DIR := $(if $(filter-out current,$(LINE)),lines/$(LINE),.)
PIN_VERSION := $(shell sed -n 's/^\#: version = //p' $(LINE_DIR)/series 2>/dev/null)

.PHONY: help setup dev check wheel image image-wheel image-base test test-slow test-full unit lint bench gpu-bundle gpu-kernel-pack gpu-stack-bundle gpu-test clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

# The tool alone (what `make check`/`make wheel` need); the test and kernel extras come with DEV.
$(BIN)/vllm-patch: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e .
	@touch $@

DEV := $(VENV)/.dev-installed
$(DEV): $(BIN)/vllm-patch
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,kernels]'
	@touch $@

setup: $(BIN)/vllm-patch ## create .venv with vllm-patch (the tool only)

dev: $(DEV) ## add the test and kernel-test tools to .venv (make unit/test/lint do)

check: setup ## check the series on the pinned vLLM release (downloads and caches its sdist), and vLLM's own ruff on what it changes
	$(BIN)/vllm-patch $(SERIES_ARGS) series
	$(BIN)/vllm-patch $(SERIES_ARGS) check
	$(BIN)/python devtools/vllm_ruff.py --line $(or $(LINE),current)

wheel: setup ## build the patched wheel into dist/ from the pinned upstream wheel (downloaded, cached)
	$(BIN)/vllm-patch $(SERIES_ARGS) build-wheel --out dist

IMAGE ?= vllm-patch:$(PIN_VERSION)
VLLM_IMAGE ?= vllm/vllm-openai:v$(PIN_VERSION)
image: ## build the container image: VLLM_IMAGE (default the line's pinned vllm/vllm-openai) with the series applied
	@LINE=$(LINE) scripts/build-image patched $(IMAGE) $(VLLM_IMAGE)

image-wheel: wheel ## build the container image from the patched wheel in dist/
	@LINE=$(LINE) scripts/build-image from-wheel $(IMAGE) $(VLLM_IMAGE)

image-base: wheel ## a local stand-in for vllm/vllm-openai (Debian + the real wheel), for hosts without a registry
	@scripts/image-base "$$($(BIN)/python -c 'from pathlib import Path; from vllm_patch.series import load_series; from vllm_patch.infrastructure.downloads import fetch; print(fetch(load_series(Path("$(LINE_DIR)")).pin.wheel, quiet=True))')" localhost/vllm-base:$(PIN_VERSION)

lint: $(DEV) ## ruff and hadolint
	$(BIN)/ruff check tool tests benchmarks guard devtools gpu
	$(BIN)/hadolint --failure-threshold warning Dockerfile

# An empty cache and an index nobody answers: a test of this tier that reaches for the network fails.
unit: $(DEV) ## the tests that need no vLLM release at all (no download: checked, with an empty cache and no index)
	@cache=$$(mktemp -d) && VLLM_PATCH_CACHE=$$cache VLLM_PATCH_INDEX_URL=http://127.0.0.1:9/simple \
		$(BIN)/pytest -q -m "not integration and not slow" -p no:cacheprovider; rc=$$?; rm -rf "$$cache"; exit $$rc

# The tiers (docs/maintaining.md#the-tests): `test` is the fast one, `test-slow` the rest, `test-full` both, each
# test once. TIME prints a tier's wall time when it ends; JOBS pytest workers (pytest-xdist) share the tests, a
# module to a worker in the slow tier (its fixtures are whole virtualenvs and release trees).
JOBS ?= 2
TIME = start=$$(date +%s); trap 'echo "$@: $$(( $$(date +%s) - start )) s"' EXIT;
test: $(DEV) lint ## lint, then the fast tier: the tool, every line's check and its CPU tests (minutes; sdists cached)
	@$(TIME) $(BIN)/pytest -q -p no:cacheprovider -n $(JOBS) -m "not slow"

test-slow: $(DEV) ## the rest: compile matrices, real-wheel venvs, images, outlooks, carried lines; patch removal
	@$(TIME) $(BIN)/pytest -q -p no:cacheprovider -n $(JOBS) --dist loadfile -m slow; rc=$$?; \
		$(BIN)/python devtools/patch_removal.py || rc=1; exit $$rc

test-full: test test-slow ## every test once: `make test`, then `make test-slow` (what CI runs)

bench: $(DEV) ## benchmark check/apply/revert on the real vLLM tree
	$(BIN)/python benchmarks/bench_core.py

gpu-bundle: $(DEV) ## make the offline bundle for a GPU host in .gpu/ (line v0.20: slimmed pinned wheel + the wheels it needs)
	$(BIN)/python gpu/bundle.py --out .gpu

gpu-kernel-pack: $(DEV) ## make the small pack for kernel-level GPU runs in .gpu/kt (line v0.20's sources + patched, no wheel)
	$(BIN)/python gpu/kernel_pack.py --out .gpu/kt

gpu-stack-bundle: $(DEV) ## a release line's own torch/triton/NCCL/vLLM (or vLLM on the host's torch) for a GPU host, in .gpu/vX.Y/pNN (LINE=current default)
	$(BIN)/python gpu/stack_bundle.py --line $(or $(LINE),current) $(STACK_ARGS)
	$(BIN)/pip wheel -q --disable-pip-version-check . -w .gpu/tool-wheels

gpu-test: ## on a GPU host: assemble .gpu/ (line v0.20), kernel tests and scenarios on both trees, report to tests/gpu/reports
	gpu/host.sh stage .gpu/p*
	gpu/host.sh all

.PHONY: gpu-fit guard
guard: setup ## build the guard's wheel into dist/ (install it into vLLM's environment: a warning at every start)
	$(BIN)/pip wheel -q --disable-pip-version-check --no-deps -w dist ./guard

gpu-fit: $(DEV) ## compile the multi-query verify kernel and its run-time variants for every GPU target on CPU (line v0.20 on Triton 3.6; the current line on 3.6, 3.7 and 3.8, the last two from PyPI): docs/gpu-fit-*triton-*.md
	$(BIN)/python gpu/fit/run_full.py $(GPU_FIT_ARGS)

clean: ## remove the venv and build leftovers (not the download cache)
	rm -rf $(VENV) build dist tool/*.egg-info .pytest_cache .ruff_cache
