"""Register the PR's GPU e2e test in upstream's CI, as upstream registers its OPD test.

Upstream lists its GPU tests in ``.github/workflows/pr-test.yml.j2`` (``{'test_file': ..., 'num_gpus': N}``
entries) and renders ``pr-test.yml`` from it with ``.github/workflows/generate_github_workflows.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TEMPLATE = ".github/workflows/pr-test.yml.j2"
RENDERED = ".github/workflows/pr-test.yml"
GENERATOR = ".github/workflows/generate_github_workflows.py"
ANCHOR = "{'test_file': 'test_qwen2.5_0.5B_opd_sglang.py', 'num_gpus': 8},"
ENTRY = "{'test_file': 'test_qwen3_0.6B_tcod.py', 'num_gpus': 8},"


def edit_template(text: str) -> str:
    """The template with our entry after every OPD entry (idempotent)."""
    if ENTRY in text:
        return text
    if ANCHOR not in text:
        raise ValueError(f"{TEMPLATE} has no {ANCHOR!r} entry to register the TCOD test next to")
    out = []
    for line in text.splitlines(keepends=True):
        out.append(line)
        if line.strip() == ANCHOR:
            out.append(line.replace(ANCHOR, ENTRY))
    return "".join(out)


def render(slime_dir: Path) -> None:
    """Re-render ``pr-test.yml`` with upstream's own generator (needs jinja2)."""
    subprocess.run([sys.executable, str(Path(slime_dir) / GENERATOR)], check=True, capture_output=True, text=True)


def register(slime_dir: Path) -> bool:
    """Add the entry and re-render; returns whether anything changed."""
    path = Path(slime_dir) / TEMPLATE
    text = path.read_text()
    new = edit_template(text)
    if new == text:
        return False
    path.write_text(new)
    render(slime_dir)
    return True
