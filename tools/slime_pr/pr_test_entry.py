"""Register the PR's tests in upstream's CI, as upstream registers its own.

    python tools/slime_pr/pr_test_entry.py SLIME_DIR

Upstream lists its CI tests in ``.github/workflows/pr-test.yml.j2`` (``{'test_file': ..., 'num_gpus': N}``
entries) and renders ``pr-test.yml`` from it with ``.github/workflows/generate_github_workflows.py`` (needs
jinja2). Two registrations:

* the GPU e2e test ``tests/test_qwen3_0.6B_tcod.py`` takes one configuration per run, so it joins
  ``megatron_tests`` (the ``run-ci-megatron`` job and, on the test image, ``run-ci-image``) once per
  configuration, with its ``test_args`` and the GPUs that configuration uses, right after
  ``test_qwen2.5_0.5B_opd_sglang.py``, the OPD test it extends (as ``test_qwen3_4B_ckpt.py`` is registered);
* the PR's CPU tests (``manifest.CPU_TEST_FILES``) go at the end of the ``cpu-unittest`` job's list
  (``num_gpus: 0``), the CPU job that installs transformers; it runs each as ``python tests/FILE``.

An edit first removes every line of the template that names one of the PR's test files, then inserts the
entries: a rerun changes nothing, an older registration is replaced.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

try:
    from . import manifest
except ImportError:  # run as a script, or imported from this folder (launch_capture.py): no sys.path change
    import manifest

TEMPLATE = ".github/workflows/pr-test.yml.j2"
RENDERED = ".github/workflows/pr-test.yml"
GENERATOR = ".github/workflows/generate_github_workflows.py"
ANCHOR = "{'test_file': 'test_qwen2.5_0.5B_opd_sglang.py', 'num_gpus': 8},"
TEST_FILE = manifest.GPU_TEST_FILE.removeprefix("tests/")
# (tcod mode, teacher type, GPUs): one entry per teacher mode, each mode of the curriculum once (upstream's OPD
# has one GPU entry). The sglang teacher serves on a GPU of its own beside the 2 the colocated actor and engines
# train on; the Megatron teacher lives in the actor. The file's NUM_GPUS (3, read by upstream's changed-tests
# job, which runs it without test_args) is the default configuration's, the first here.
GPU_CONFIGS = (
    ("b2f", "sglang", 3),
    ("f2b", "megatron", 2),
)
GPU_ENTRIES = tuple(
    f"{{'test_file': '{TEST_FILE}', 'test_args': '--tcod-mode {mode} --opd-type {opd}', 'num_gpus': {gpus}}},"
    for mode, opd, gpus in GPU_CONFIGS
)
CPU_JOB = "cpu-unittest"
CPU_JOB_LINE = f"'{CPU_JOB}': {{"
CPU_ENTRIES = tuple(f"{{'test_file': '{rel.removeprefix('tests/')}', 'num_gpus': 0}}," for rel in manifest.CPU_TEST_FILES)
ENTRIES = GPU_ENTRIES + CPU_ENTRIES
_NAMES = tuple(f"'{rel.removeprefix('tests/')}'" for rel in manifest.TEST_FILES)


class RegisterError(ValueError):
    """The template is not the one these entries were written for."""


def _only_line(lines: list[str], text: str, what: str) -> int:
    found = [i for i, line in enumerate(lines) if line.strip() == text]
    if len(found) != 1:
        raise RegisterError(f"{TEMPLATE}: {what} {text!r} is there {len(found)} times, not once")
    return found[0]


def _cpu_list_end(lines: list[str]) -> int:
    """Index of the `],` that closes the cpu-unittest job's 'tests' list."""
    start = _only_line(lines, CPU_JOB_LINE, "the job line")
    tests = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == "'tests': ["), None)
    if tests is None:
        raise RegisterError(f"{TEMPLATE}: the {CPU_JOB} job has no 'tests': [ list")
    end = next((i for i in range(tests + 1, len(lines)) if lines[i].strip() == "],"), None)
    if end is None or any(line.strip().endswith("{") for line in lines[tests + 1 : end]):
        raise RegisterError(f"{TEMPLATE}: the {CPU_JOB} job's 'tests' list does not end where expected")
    return end


def edit_template(text: str) -> str:
    """The template with the PR's entries, each once, where they belong; unchanged if they are there."""
    lines = [line for line in text.splitlines(keepends=True) if not any(n in line for n in _NAMES)]
    anchor = _only_line(lines, ANCHOR, "the OPD test's entry")
    gpu_indent = lines[anchor][: len(lines[anchor]) - len(lines[anchor].lstrip())]
    end = _cpu_list_end(lines)
    last = lines[end - 1]
    cpu_indent = last[: len(last) - len(last.lstrip())]
    # Bottom-up, so that the first insertion leaves the second's index valid.
    inserts = sorted([(anchor + 1, gpu_indent, GPU_ENTRIES), (end, cpu_indent, CPU_ENTRIES)], reverse=True)
    for at, indent, entries in inserts:
        lines[at:at] = [f"{indent}{entry}\n" for entry in entries]
    return "".join(lines)


def render(slime_dir) -> None:
    """Re-render ``pr-test.yml`` with upstream's own generator."""
    subprocess.run([sys.executable, str(Path(slime_dir) / GENERATOR)], check=True, capture_output=True, text=True)


def register(slime_dir) -> bool:
    """Insert the entries into SLIME_DIR's template and re-render; returns whether anything changed."""
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
    names = ", ".join(rel.removeprefix("tests/") for rel in manifest.TEST_FILES)
    print(f"{TEMPLATE}: {names} {'registered' if changed else 'were registered already'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
