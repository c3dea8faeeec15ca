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

.PHONY: venv test demo clean

# One line per stage, each timed; the two large downloads show pip's progress bars (pip -q was silent for
# minutes there).
STAGE = @printf 'make venv: [%s] %s\n' "$$(date +%H:%M:%S)"

$(STAMP): pyproject.toml Makefile
	$(STAGE) "1/5 $(VENV): a virtual environment from $(PYTHON)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(STAGE) "2/5 pip: upgrading"
	@$(PY) -m pip install -q --upgrade pip
	@if ! $(PY) -c "import torch" 2>/dev/null && [ -n "$(TORCH_SPEC)" ]; then \
		printf 'make venv: [%s] %s\n' "$$(date +%H:%M:%S)" "3/5 $(TORCH_SPEC): the largest download (minutes; pip's bars)"; \
		$(PY) -m pip install --progress-bar on "$(TORCH_SPEC)"; \
	else printf 'make venv: [%s] %s\n' "$$(date +%H:%M:%S)" "3/5 torch: already installed"; fi
	@if ! $(PY) -c "import megatron.core" 2>/dev/null && [ -n "$(MEGATRON_SPEC)" ]; then \
		printf 'make venv: [%s] %s\n' "$$(date +%H:%M:%S)" "4/5 $(MEGATRON_SPEC)"; \
		$(PY) -m pip install --progress-bar on "$(MEGATRON_SPEC)"; \
	else printf 'make venv: [%s] %s\n' "$$(date +%H:%M:%S)" "4/5 megatron-core: already installed"; fi
	$(STAGE) "5/5 this repository and its dependencies (pip install -e .[dev,envs]: transformers, ray, environments)"
	@$(PY) -m pip install -q -e ".[dev,envs]"
	@touch $(STAMP)
	$(STAGE) "done: $(VENV) is ready"

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest tests

demo: $(STAMP)
	PYTHON=$(abspath $(PY)) bash scripts/run-tiny-tcod.sh

clean:
	rm -rf $(VENV)
