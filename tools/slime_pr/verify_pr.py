"""The PR read as a maintainer would: its size, upstream's linters, its own tests and links, in the ported tree.

    python tools/slime_pr/verify_pr.py PRISTINE PORTED

* size: lines added in all and under ``slime/`` (budget 2,500 / 400), upstream files replaced or losing lines;
* upstream's pinned linters (``lint.py``, upstream's settings) on every Python file the PR adds or edits;
* the PR's CPU tests (``manifest.TEST_FILES`` except the GPU test) with ``python -m pytest`` in the ported tree;
* every relative link of the PR's Markdown files resolves inside the ported tree.

One line per check; exit 1 if any failed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import lint, manifest  # noqa: E402

MAX_ADDED, MAX_CORE, MAX_REMOVED = 2500, 400, 5
GPU_TEST = "tests/test_qwen3_0.6B_tcod.py"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
    if not ok:
        FAILED.append(what)


SKIP = {".git", "__pycache__", ".pytest_cache", ".ruff_cache"}


def _files(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not SKIP & set(p.relative_to(root).parts) and p.suffix != ".pyc"
    }


def diff_stats(pristine: Path, ported: Path) -> tuple[dict[str, tuple[int, int]], int]:
    """Per changed file (added, removed) lines, and the lines added in all."""
    import difflib

    before, after = _files(pristine), _files(ported)
    files = {}
    for rel in sorted(set(before) | set(after)):
        old = before[rel].read_bytes() if rel in before else b""
        new = after[rel].read_bytes() if rel in after else b""
        if old == new:
            continue
        diff = difflib.ndiff(old.decode(errors="replace").splitlines(), new.decode(errors="replace").splitlines())
        counts = [0, 0]
        for line in diff:
            if line[:1] in "+-" and line[1:2] == " ":
                counts[line[0] == "-"] += 1
        files[rel] = tuple(counts)
    return files, sum(a for a, _ in files.values())


def main(argv=None) -> int:
    pristine, ported = (Path(p).resolve() for p in (argv or sys.argv[1:]))
    files, added = diff_stats(pristine, ported)
    core = sum(a for rel, (a, _) in files.items() if rel.startswith("slime/"))
    check(added <= MAX_ADDED, f"size: {len(files)} files, +{added} lines (budget {MAX_ADDED})")
    check(core <= MAX_CORE, f"size: +{core} lines under slime/ (budget {MAX_CORE})")
    shrunk = {rel: r for rel, (_, r) in files.items() if r > MAX_REMOVED or (r and not (ported / rel).exists())}
    check(not shrunk, f"no upstream file replaced or losing more than {MAX_REMOVED} lines {shrunk or ''}")

    py = [rel for rel in files if rel.endswith(".py")]
    findings = lint.lint([str(ported / rel) for rel in py]) if not lint.missing_linters() else ["linters missing"]
    check(not findings, f"upstream's linters on the PR's {len(py)} Python files: {len(findings)} findings")
    for line in findings[:20]:
        print(f"      {line}")

    tests = [t for t in manifest.TEST_FILES if t != GPU_TEST]
    # sglang, ray and sglang_router (in upstream's image, not installable here) are stubbed as smoke.py does.
    runner = (
        f"import sys; sys.path.insert(0, {str(manifest.REPO)!r}); from tools.slime_pr import stubs; "
        f"sys.path[0] = {str(ported)!r}; stubs.install(('ray', 'sglang', 'sglang_router')); "
        f"import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *{tests!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", runner], cwd=ported, capture_output=True, text=True)
    summary = (out.stdout.strip().splitlines() or ["no output"])[-1]
    check(out.returncode == 0, f"the PR's CPU tests in the ported tree: {summary}")

    dead = []
    for rel in [r for r in files if r.endswith(".md")]:
        old = set(LINK.findall((pristine / rel).read_text())) if (pristine / rel).exists() else set()
        for target in set(LINK.findall((ported / rel).read_text())) - old:  # upstream's own links are its own
            if not target.startswith(("http://", "https://")) and not (ported / rel).parent.joinpath(target).exists():
                dead.append(f"{rel} -> {target}")
    check(not dead, f"every relative link of the PR's Markdown resolves in the ported tree {dead or ''}")
    print(f"verify_pr.py: {'OK' if not FAILED else f'{len(FAILED)} failed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
