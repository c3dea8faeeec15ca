"""Upstream slime's pre-commit linters, at their pinned versions, on the PR's Python files.

    python tools/slime_pr/lint.py [--fix] [FILE ...]

Without files: every Python file of the PR as it lives in this repository (``manifest.python_files()``).
The settings are upstream's (``upstream_lint/pyproject.toml``); the versions are checked, since another
black or ruff formats differently. Prints one line per finding; exit 1 if there is any.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import manifest  # noqa: E402

CONFIG = Path(__file__).resolve().parent / "upstream_lint" / "pyproject.toml"
PINNED = {"black": "24.3.0", "isort": "5.13.2", "ruff": "0.14.7", "autoflake": "2.0.2"}


def _version(tool: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(tool)
    except PackageNotFoundError:
        return None


def missing_linters() -> list[str]:
    """``tool==version`` for each pinned linter that is absent or at another version."""
    return [f"{tool}=={want}" for tool, want in PINNED.items() if _version(tool) != want]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=manifest.REPO, capture_output=True, text=True)


def lint(files: list[str], fix: bool = False) -> list[str]:
    """Findings (empty: clean). With ``fix`` the files are rewritten first, as pre-commit would."""
    cfg = str(CONFIG)
    findings = []
    ruff = ["ruff", "check", "--config", cfg, *(["--fix"] if fix else []), "--output-format", "concise", *files]
    out = _run(ruff)
    findings += [f"ruff: {line}" for line in out.stdout.splitlines() if ":" in line and not line.startswith("Found")]
    autoflake = ["autoflake", "--remove-all-unused-imports", "--in-place" if fix else "--check", *files]
    out = _run(autoflake)
    if not fix:
        findings += [f"autoflake: {line}" for line in out.stdout.splitlines() if "Unused imports" in line]
    out = _run(["isort", "--settings-path", cfg, "--filter-files", *([] if fix else ["--check-only"]), *files])
    findings += [f"isort: {line}" for line in (out.stdout + out.stderr).splitlines() if "ERROR" in line]
    out = _run(["black", "--config", cfg, *([] if fix else ["--check"]), *files])
    findings += [f"black: {line}" for line in out.stderr.splitlines() if line.startswith("would reformat")]
    return findings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fix", action="store_true", help="rewrite the files as upstream's hooks would")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    if missing_linters():
        print(f"lint.py: install the pinned linters first: pip install {' '.join(missing_linters())}", file=sys.stderr)
        return 2
    findings = lint(args.files or manifest.python_files(), fix=args.fix)
    for line in findings:
        print(line)
    print(f"lint.py: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
