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

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if ! $(PY) -c "import torch" 2>/dev/null && [ -n "$(TORCH_SPEC)" ]; then \
		echo "installing $(TORCH_SPEC)"; $(PY) -m pip install -q "$(TORCH_SPEC)"; fi
	@if ! $(PY) -c "import megatron.core" 2>/dev/null && [ -n "$(MEGATRON_SPEC)" ]; then \
		echo "installing $(MEGATRON_SPEC)"; $(PY) -m pip install -q "$(MEGATRON_SPEC)"; fi
	$(PY) -m pip install -q -e ".[dev,envs]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest tests

demo: $(STAMP)
	PYTHON=$(abspath $(PY)) bash scripts/run-tiny-tcod.sh

clean:
	rm -rf $(VENV)
