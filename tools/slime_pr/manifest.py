"""Which files of this repository the slime pull request carries, and where they go upstream.

Every path here is relative to this repository's root and lands at the same path in upstream's tree,
except ``slime/utils/tcod_arguments.py``, whose two functions ``port.py`` splices into upstream's
``slime/utils/arguments.py`` (a nested group and an inline validation block). ``port.py`` also adds a
two-line getter to upstream's ``slime/rollout/sample_hooks.py``. Everything else in this repository is the
standalone runtime; ``tools/slime_pr/PR.md`` is the PR's description, not one of its files.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Upstream commit whose APIs the port was written against.
VERIFIED_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"

# Spliced into upstream's slime/utils/arguments.py, not copied.
ARGUMENTS_SOURCE = "slime/utils/tcod_arguments.py"

CORE_FILES = ("slime/rollout/tcod.py",)

EXAMPLE_FILES = (
    "examples/multi_turn_tcod/README.md",
    "examples/multi_turn_tcod/__init__.py",
    "examples/multi_turn_tcod/run-qwen3-8B-tcod.sh",
    "examples/multi_turn_tcod/multi_turn_tcod_config.yaml",
    "examples/multi_turn_tcod/rollout.py",
    "examples/multi_turn_tcod/chat_layout.py",
    "examples/multi_turn_tcod/metrics.py",
    "examples/multi_turn_tcod/envs/__init__.py",
    "examples/multi_turn_tcod/envs/common.py",
    "examples/multi_turn_tcod/envs/gridnav.py",
    "examples/multi_turn_tcod/envs/make_data.py",
)

# Tests that need no GPU (NUM_GPUS = 0): registered in upstream's `cpu-unittest` job, which runs each as
# `python tests/FILE` on Python 3.10 without sglang or Megatron (tools/slime_pr/cpu_ci.py runs them so).
CPU_TEST_FILES = (
    "tests/test_tcod_arguments.py",
    "tests/test_tcod_rollout.py",
    "tests/test_tcod_e2e_cpu.py",
)
# The GPU e2e test: one CI entry per configuration (pr_test_entry.GPU_CONFIGS).
GPU_TEST_FILE = "tests/test_qwen3_0.6B_tcod.py"

TEST_FILES = (*CPU_TEST_FILES, GPU_TEST_FILE)

DOC_FILES = (
    "docs/en/advanced/multi-turn-tcod.md",
    "docs/zh/advanced/multi-turn-tcod.md",
)

COPIED_FILES = CORE_FILES + EXAMPLE_FILES + TEST_FILES + DOC_FILES


def python_files() -> list[str]:
    """The PR's Python files as they exist in this repository (the linters' input)."""
    return [p for p in (ARGUMENTS_SOURCE, *COPIED_FILES) if p.endswith(".py")]
