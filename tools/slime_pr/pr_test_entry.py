"""Register the PR's GPU e2e test in upstream's CI, as upstream registers its OPD test.

    python tools/slime_pr/pr_test_entry.py SLIME_DIR

Upstream lists its GPU tests in ``.github/workflows/pr-test.yml.j2`` (``{'test_file': ..., 'num_gpus': N}``
entries) and renders ``pr-test.yml`` from it with ``.github/workflows/generate_github_workflows.py`` (needs
jinja2). ``tests/test_qwen3_0.6B_tcod.py`` joins ``megatron_tests`` right after
``test_qwen2.5_0.5B_opd_sglang.py``, the OPD test it extends; without ``test_args`` it runs its four
cases (F2B, B2F, each with the server and the Megatron teacher) in sequence. ``megatron_tests`` runs in
the ``run-ci-megatron`` job and, on the test image, in ``run-ci-image``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

TEMPLATE = ".github/workflows/pr-test.yml.j2"
RENDERED = ".github/workflows/pr-test.yml"
GENERATOR = ".github/workflows/generate_github_workflows.py"
ANCHOR = "{'test_file': 'test_qwen2.5_0.5B_opd_sglang.py', 'num_gpus': 8},"
TEST_FILE = "test_qwen3_0.6B_tcod.py"
# num_gpus is the test's NUM_GPUS (the changed-tests job reads it from the file instead).
ENTRY = f"{{'test_file': '{TEST_FILE}', 'num_gpus': 4}},"


class RegisterError(ValueError):
    """The template is not the one this entry was written for."""


def edit_template(text: str) -> str:
    """The template with ENTRY on the line after the OPD entry, same indentation; unchanged if it is there."""
    if ENTRY in text:
        return text
    if TEST_FILE in text:
        raise RegisterError(f"{TEMPLATE} names {TEST_FILE} but not as {ENTRY!r}; fix it by hand")
    lines = text.splitlines(keepends=True)
    anchors = [i for i, line in enumerate(lines) if line.strip() == ANCHOR]
    if len(anchors) != 1:
        raise RegisterError(f"{TEMPLATE}: the line {ANCHOR!r} is there {len(anchors)} times, not once")
    anchor = lines[anchors[0]]
    lines.insert(anchors[0] + 1, anchor.replace(ANCHOR, ENTRY))
    return "".join(lines)


def render(slime_dir) -> None:
    """Re-render ``pr-test.yml`` with upstream's own generator."""
    subprocess.run([sys.executable, str(Path(slime_dir) / GENERATOR)], check=True, capture_output=True, text=True)


def register(slime_dir) -> bool:
    """Insert the entry into SLIME_DIR's template and re-render; returns whether anything changed."""
    slime_dir = Path(slime_dir)
    path, rendered = slime_dir / TEMPLATE, slime_dir / RENDERED
    if not path.is_file() or not (slime_dir / GENERATOR).is_file():
        raise RegisterError(f"{slime_dir} has no {TEMPLATE} or no {GENERATOR}")
    text = path.read_text()
    new = edit_template(text)
    before = rendered.read_bytes() if rendered.is_file() else None
    if new != text:
        path.write_text(new)
    render(slime_dir)  # also when the template was edited already: pr-test.yml must follow it
    return new != text or rendered.read_bytes() != before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slime_dir", type=Path, help="an upstream THUDM/slime checkout (changed in place)")
    opts = parser.parse_args(argv)
    try:
        changed = register(opts.slime_dir)
    except RegisterError as err:
        print(f"pr_test_entry: {err}", file=sys.stderr)
        return 1
    print(f"{TEMPLATE}: {TEST_FILE} {'registered' if changed else 'was registered already'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
