"""Which files the adaptive-KL pull request (THUDM/slime #2387) carries, and where they go upstream.

``slime/utils/kl_controller.py`` is this repository's own file (shared with the runtime's trainer) and lands at
the same path upstream. The other added files live under ``tools/slime_pr/adaptive_kl/`` at their upstream
paths. The edits of upstream's files (arguments, loss, actor, the argument-validation fixture, the CI template,
the docs toctrees) are anchored text replacements in ``port_adaptive_kl.py``.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tools" / "slime_pr" / "adaptive_kl"
PR_DESCRIPTION = REPO / "tools" / "slime_pr" / "PR_adaptive_kl.md"

VERIFIED_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"

# upstream path -> where its content lives in this repository
SHARED_FILES = {"slime/utils/kl_controller.py": REPO / "slime/utils/kl_controller.py"}

CPU_TEST_FILES = (
    "tests/test_kl_controller.py",
    "tests/test_kl_controller_cp.py",
)
GPU_TEST_FILE = "tests/test_qwen3_4B_ppo_adaptive_kl.py"
GPU_TEST_GPUS = 8
DOC_FILES = (
    "docs/en/advanced/adaptive-kl-controller.md",
    "docs/zh/advanced/adaptive-kl-controller.md",
)
ADDED_FILES = {rel: SOURCE / rel for rel in (*CPU_TEST_FILES, GPU_TEST_FILE, *DOC_FILES)}
COPIED_FILES = {**SHARED_FILES, **ADDED_FILES}

# Upstream files the port edits.
EDITED_FILES = (
    "slime/utils/arguments.py",
    "slime/backends/megatron_utils/loss.py",
    "slime/backends/megatron_utils/actor.py",
    "slime/backends/megatron_utils/server/arguments.py",
    "tests/test_megatron_argument_validation.py",
    ".github/workflows/pr-test.yml.j2",
    "docs/en/index.rst",
    "docs/zh/index.rst",
    "docs/en/get_started/usage.md",
    "docs/zh/get_started/usage.md",
)


def python_files() -> list[str]:
    """The PR's added Python files, as upstream paths."""
    return [rel for rel in COPIED_FILES if rel.endswith(".py")]
