# One command each: `make test` runs the test suite, `make demo` runs the CPU TCOD demo.
# Both create .venv and install into it first. GPU users: pre-install your CUDA torch into .venv
# (or set TORCH_SPEC=) and the CPU pin below is skipped; likewise megatron-core (MEGATRON_SPEC=), which
# the megatron backend's CPU tests use (0.16.1: the newest release for Python 3.11).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
MEGATRON_SPEC ?= megatron-core==0.16.1
STAMP := $(VENV)/.installed

.PHONY: venv sglang-env test demo clean

# One timed line per stage, and one every 10 s while a quiet pip install runs (scripts/with-progress.sh):
# measured on a fresh clone, the dependencies' stage alone took 7 minutes on a busy machine.
STAGE = @printf '[%s] %s\n' "$$(date +%H:%M:%S)"
PROGRESS = bash scripts/with-progress.sh

$(STAMP): pyproject.toml Makefile
	$(STAGE) "make venv: 1/5 $(VENV): a virtual environment from $(PYTHON)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PROGRESS) "make venv: 2/5 pip: upgrading" $(PY) -m pip install -q --upgrade pip
	@if ! $(PY) -c "import torch" 2>/dev/null && [ -n "$(TORCH_SPEC)" ]; then \
		$(PROGRESS) "make venv: 3/5 $(TORCH_SPEC), the largest download" $(PY) -m pip install -q "$(TORCH_SPEC)"; \
	else printf '[%s] %s\n' "$$(date +%H:%M:%S)" "make venv: 3/5 torch: already installed"; fi
	@if ! $(PY) -c "import megatron.core" 2>/dev/null && [ -n "$(MEGATRON_SPEC)" ]; then \
		$(PROGRESS) "make venv: 4/5 $(MEGATRON_SPEC)" $(PY) -m pip install -q "$(MEGATRON_SPEC)"; \
	else printf '[%s] %s\n' "$$(date +%H:%M:%S)" "make venv: 4/5 megatron-core: already installed"; fi
	@$(PROGRESS) "make venv: 5/5 this repository and its dependencies (transformers, ray, environments)" \
		$(PY) -m pip install -q -e ".[dev,envs]"
	@touch $(STAMP)
	$(STAGE) "make venv: done, $(VENV) is ready"

venv: $(STAMP)

# Real SGLang 0.5.15.post1 in a cached venv of its own (it pins its own torch and transformers): built once,
# found afterwards; `--rollout-backend sglang --sglang-python "$$(make -s sglang-env)"` runs servers from it.
sglang-env: $(STAMP)
	@$(PY) -m slime.backends.sglang_utils.sglang_env --check >/dev/null 2>&1 || \
		$(PROGRESS) "sglang env: SGLang's own venv (docs/en/engines.md; once)" $(PY) -m slime.backends.sglang_utils.sglang_env >&2
	@$(PY) -m slime.backends.sglang_utils.sglang_env --check

test: $(STAMP) sglang-env
	$(PY) -m pytest tests

demo: $(STAMP)
	PYTHON=$(abspath $(PY)) bash scripts/run-tiny-tcod.sh

clean:
	rm -rf $(VENV)
