"""A PR read as a maintainer would: its size, its wording, upstream's linters, its own tests and links.

    python tools/slime_pr/verify_pr.py [--pr tcod|adaptive-kl] PRISTINE PORTED
    python tools/slime_pr/verify_pr.py --lint SLIME_DIR [--pr tcod|adaptive-kl] [--fix] [FILE ...]

Checked: the manifest's ``CAPS`` (lines added under ``slime/`` and in all, ``UNCOUNTED`` apart; the example's Python;
no upstream file replaced or losing more than ``CAPS["removed"]`` lines); no added line naming this repository's
runtime (``RUNTIME_NAMES``); upstream's pre-commit linters at their ``PINNED`` versions with upstream's pyproject.toml
on every Python file it adds or edits (``--lint``: on this repository's copies of them, or FILE ..., with SLIME_DIR's
settings; ``--fix`` rewrites them); its tests as upstream's CI finds them (``registration_problems``); every relative
link of its Markdown resolving in the ported tree. One line per check, then the counts; exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import cpu_ci, port  # noqa: E402

MAIN_RUNNER = 'if __name__ == "__main__":\n    raise SystemExit(pytest.main([__file__]))\n'
NUM_GPUS_LINE = re.compile(r"^NUM_GPUS\s*=\s*(\d+)", re.M)  # what upstream's changed-tests job greps
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# What only this repository's runtime has, so no PR file may name it: the repository itself, its CPU demo,
# its environments that do not ship with the example, attributes that only its own flags set (upstream
# would raise AttributeError), its environment package and its second environment contract (make_env).
# Matched case-insensitively as whole words, in the lines the PR adds.
RUNTIME_NAMES = ("slime-tcod", "hanoi", "ScienceWorld", "TextWorld", "ALFWorld", "WebShop", "the demo",
                 "engine_limits", "rollout_engine_urls", "tcod_prefix_source", "tcod_prefix_replay_path",
                 "examples.agent_envs", "make_env")
_RUNTIME_NAME = re.compile(r"(?<![\w-])(" + "|".join(re.escape(n) for n in RUNTIME_NAMES) + r")(?![\w-])", re.I)
# The paper's benchmarks may be named where a setting or a result is cited to the official TCOD configs or paper
# (the launch script's eta values come from its ALFWorld / ScienceWorld / WebShop YAMLs); nowhere else.
OFFICIAL_BENCHMARKS = {"scienceworld", "alfworld", "webshop"}
OFFICIAL_CITATION = re.compile(r"official|kokolerk/TCOD", re.I)
# A Markdown line that names the standalone repository is a pointer to it (the example README's "The paper's
# environments" and its CPU study): there the runtime's names say what the reader finds in that repository.
STANDALONE = re.compile(r"(?<![\w-])slime-tcod(?![\w-])")
SKIP = {".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
PINNED = {"black": "24.3.0", "isort": "5.13.2", "ruff": "0.14.7", "autoflake": "2.0.2"}
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
    if not ok:
        FAILED.append(what)


# ---------------------------------------------------------------------------- linters
def missing_linters() -> list[str]:
    """``tool==version`` for each pinned linter that is absent or at another version (another formats otherwise)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(tool):
        try:
            return version(tool)
        except PackageNotFoundError:
            return None

    return [f"{tool}=={want}" for tool, want in PINNED.items() if installed(tool) != want]


def linter_python() -> str | None:
    """A Python that has the pinned linters: this one if it has them, else a venv of its own made once under
    ``$LINTERS_CACHE`` (default ``~/.cache/slime-tcod/linters``), never the runtime's. None when it would have to
    be made and ``VERIFY_NO_INSTALL=1`` forbids installing."""
    if not missing_linters():
        return sys.executable
    pins = sorted(f"{tool}=={want}" for tool, want in PINNED.items())
    root = Path(os.environ.get("LINTERS_CACHE") or Path.home() / ".cache" / "slime-tcod" / "linters")
    key = " ".join([*pins, sys.version.split()[0]])  # a venv is bound to the Python that made it
    venv = root / hashlib.sha256(key.encode()).hexdigest()[:12]
    python, done = venv / "bin" / "python", venv / ".complete"
    if done.is_file() and python.exists():
        return str(python)
    if os.environ.get("VERIFY_NO_INSTALL") == "1":
        return None
    print(f"verify_pr.py: installing slime's pinned linters ({' '.join(pins)}) into {venv}, once ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    except subprocess.CalledProcessError as err:
        print(f"verify_pr.py: could not install the linters ({err}); pip install {' '.join(pins)} by hand", flush=True)
        return None
    done.write_text(" ".join(pins) + "\n")
    return str(python)


def lint(files: list[str], settings: Path, fix: bool = False, python: str = sys.executable) -> list[str]:
    """Findings (empty: clean) with upstream's settings (its pyproject.toml). ``fix`` rewrites the files first, as
    pre-commit would. ``python`` has the pinned linters (:func:`linter_python`)."""
    cfg = str(settings)

    def run(*cmd):
        return subprocess.run([python, "-m", *cmd], cwd=port.REPO, capture_output=True, text=True)

    out = run("ruff", "check", "--config", cfg, *(["--fix"] if fix else []), "--output-format", "concise", *files)
    findings = [f"ruff: {ln}" for ln in out.stdout.splitlines() if ":" in ln and not ln.startswith("Found")]
    out = run("autoflake", "--remove-all-unused-imports", "--in-place" if fix else "--check", *files)
    findings += [] if fix else [f"autoflake: {ln}" for ln in out.stdout.splitlines() if "Unused imports" in ln]
    out = run("isort", "--settings-path", cfg, "--filter-files", *([] if fix else ["--check-only"]), *files)
    findings += [f"isort: {ln}" for ln in (out.stdout + out.stderr).splitlines() if "ERROR" in ln]
    out = run("black", "--config", cfg, *([] if fix else ["--check"]), *files)
    return findings + [f"black: {ln}" for ln in out.stderr.splitlines() if ln.startswith("would reformat")]


# ---------------------------------------------------------------------------- the diff
def _files(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not SKIP & set(p.relative_to(root).parts) and p.suffix != ".pyc"
    }


def line_changes(old: str, new: str) -> tuple[list[tuple[int, str]], int]:
    """The lines ``new`` adds to ``old`` as (1-based line in ``new``, text), and how many of ``old``'s it drops."""
    a, b = old.splitlines(), new.splitlines()
    added, removed = [], 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            added += [(j + 1, b[j]) for j in range(j1, j2)]
        if tag in ("replace", "delete"):
            removed += i2 - i1
    return added, removed


def diff_stats(pristine: Path, ported: Path) -> dict[str, tuple[list[tuple[int, str]], int]]:
    """Per changed file: (the lines it adds, the number of lines it drops)."""
    before, after = _files(pristine), _files(ported)
    files = {}
    for rel in sorted(set(before) | set(after)):
        old = before[rel].read_bytes() if rel in before else b""
        new = after[rel].read_bytes() if rel in after else b""
        if old != new:
            files[rel] = line_changes(old.decode(errors="replace"), new.decode(errors="replace"))
    return files


def pointer_lines(markdown: str) -> set[int]:
    """1-based numbers of the Markdown lines that point to the standalone repository: those naming it, and the
    lines of a fenced code block whose paragraph before it names it (its commands run there)."""
    lines, exempt, fence, pointer = markdown.splitlines(), set(), False, False
    for number, text in enumerate(lines, 1):
        if text.lstrip().startswith("```"):
            if not fence:
                before = next((t for t in reversed(lines[: number - 1]) if t.strip()), "")
                pointer = bool(STANDALONE.search(before))
            fence = not fence
            continue
        if STANDALONE.search(text) or (fence and pointer):
            exempt.add(number)
    return exempt


def runtime_name_hits(rel: str, added: list[tuple[int, str]], text: str | None = None) -> list[str]:
    """``file:line: 'name'`` for every runtime name on a line the PR adds to ``rel`` (``text``: its new content)."""
    hits = []
    exempt = pointer_lines(text) if rel.endswith(".md") and text is not None else set()
    for number, text in added:
        if number in exempt:
            continue
        for match in _RUNTIME_NAME.finditer(text):
            if match.group(1).lower() in OFFICIAL_BENCHMARKS and OFFICIAL_CITATION.search(text):
                continue
            hits.append(f"{rel}:{number}: {match.group(1)!r}")
    return hits


# ---------------------------------------------------------------------------- its tests in upstream's CI
def registration_problems(ported: Path, conftests: list[str], pr) -> list[str]:
    """What keeps upstream's CI from running the PR's tests as intended, one line each: NUM_GPUS, upstream's
    ``__main__`` runner, registration in a CPU job or once per GPU configuration, a conftest.py."""
    problems = [f"{rel}: the PR adds a conftest.py; a test stubs what it needs itself" for rel in conftests]
    for rel in pr.TEST_FILES:
        if not (ported / rel).is_file():
            problems.append(f"{rel}: not in the ported tree")
            continue
        text = (ported / rel).read_text()
        gpus = NUM_GPUS_LINE.findall(text)
        want = "0" if rel in pr.CPU_TEST_FILES else str(pr.GPU_REGISTRATION[0][1])
        if gpus[:1] != [want]:
            problems.append(f"{rel}: NUM_GPUS is {gpus[0] if gpus else 'not set'}, want {want}")
        if rel in pr.CPU_TEST_FILES and not text.endswith(MAIN_RUNNER):
            problems.append(f"{rel}: does not end with upstream's runner {MAIN_RUNNER.splitlines()[1].strip()!r}")
    try:
        rendered = cpu_ci.render(ported)["jobs"]
        cpu = {rel for job in cpu_ci.cpu_jobs(ported) for rel, _ in job.tests}
    except Exception as err:  # noqa: BLE001 - a template that does not render is itself the finding
        return problems + [f"{port.TEMPLATE} does not render: {type(err).__name__}: {err}"]
    problems += [f"{rel}: not registered in a CPU job" for rel in pr.CPU_TEST_FILES if rel not in cpu]
    if not pr.GPU_TEST_FILE:  # a PR without a GPU test (tcod-core-only)
        return problems
    gpu_name, want = pr.GPU_TEST_FILE.removeprefix("tests/"), sorted(pr.GPU_REGISTRATION)
    registered = False
    for name, job in rendered.items():
        if job.get("runs-on") == "ubuntu-latest":
            continue
        got = sorted((e.get("test_args", ""), e.get("num_gpus")) for e in _matrix_entries(job)
                     if e.get("test_file") == gpu_name)
        registered |= bool(got)
        if got and got != want:
            problems.append(f"{pr.GPU_TEST_FILE} in job {name}: entries {got}, want {want}")
    if not registered:
        problems.append(f"{pr.GPU_TEST_FILE}: not registered in any GPU job")
    return problems


def _matrix_entries(job) -> list[dict]:
    """A rendered job's ``strategy.matrix.info`` entries ([] for a matrix computed at run time)."""
    matrix = job.get("strategy", {}).get("matrix") if isinstance(job.get("strategy"), dict) else None
    info = matrix.get("info") if isinstance(matrix, dict) else None
    return [e for e in info if isinstance(e, dict)] if isinstance(info, list) else []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pr", choices=tuple(port.PRS), default="tcod")
    parser.add_argument("--lint", action="store_true", help="only the linters (SLIME_DIR's settings), on this "
                        "repository's PR files")
    parser.add_argument("--fix", action="store_true", help="with --lint: rewrite the files as upstream's hooks would")
    parser.add_argument("paths", nargs="*", help="PRISTINE PORTED, or with --lint SLIME_DIR [FILE ...]")
    opts = parser.parse_args(argv)
    pr = port.manifest_of(opts.pr)
    if opts.lint:
        linters = linter_python()
        if linters is None:
            print(f"verify_pr.py: no pinned linters (VERIFY_NO_INSTALL=1, or their install failed): "
                  f"pip install {' '.join(missing_linters())}")
            return 2
        if not opts.paths:
            parser.error("--lint needs SLIME_DIR, an upstream checkout whose pyproject.toml holds the settings")
        ours = [str(p) for p in (*port.sources(pr).values(), *(port.REPO / s for s in pr.SPLICED)) if p.suffix == ".py"]
        findings = lint(opts.paths[1:] or ours, Path(opts.paths[0]) / "pyproject.toml", fix=opts.fix, python=linters)
        print("\n".join([*findings, f"verify_pr.py --lint: {len(findings)} finding(s)"]))
        return 1 if findings else 0
    if len(opts.paths) != 2:
        parser.error("give PRISTINE and PORTED")
    pristine, ported = (Path(p).resolve() for p in opts.paths)
    files = diff_stats(pristine, ported)
    caps = pr.CAPS
    counted = {rel: v for rel, v in files.items() if rel not in pr.UNCOUNTED}
    added = sum(len(a) for a, _ in counted.values())
    core = sum(len(a) for rel, (a, _) in files.items() if rel.startswith("slime/"))
    counts = []
    if "example_py" in caps:
        example_py = sum(len(p.read_text().splitlines()) for p in sorted((ported / pr.EXAMPLE_DIR).rglob("*.py")))
        check(example_py <= caps["example_py"],
              f"size: the example's Python is {example_py} lines (cap {caps['example_py']})")
        counts.append(f"example Python {example_py} lines")
    check(core <= caps["core"], f"size: +{core} lines under slime/ (cap {caps['core']})")
    uncounted = f", {len(files) - len(counted)} CI file(s) not counted" if len(counted) < len(files) else ""
    check(added <= caps["added"], f"size: {len(files)} files, +{added} lines (cap {caps['added']}{uncounted})")
    counts += [f"slime/ +{core} lines", f"total +{added} lines"]
    limit = caps.get("removed")
    shrunk = {rel: r for rel, (_, r) in files.items()
              if (limit is not None and r > limit) or (r and not (ported / rel).exists())}
    check(not shrunk, "no upstream file replaced" + (f" or losing more than {limit} lines" if limit is not None else "")
          + f" {shrunk or ''}")
    hits = [hit for rel, (lines, _) in files.items()
            for hit in runtime_name_hits(rel, lines, (ported / rel).read_text() if rel.endswith(".md") else None)]
    check(not hits, f"no PR line names this repository's runtime (RUNTIME_NAMES): {len(hits)} hits")
    for hit in hits:
        print(f"      {hit}")

    py = [rel for rel in files if rel.endswith(".py")]
    settings = pristine / "pyproject.toml"  # upstream's own
    linters = linter_python()
    findings = (lint([str(ported / rel) for rel in py], settings, python=linters) if linters else
                [f"linters missing (VERIFY_NO_INSTALL=1, or their install failed): "
                 f"pip install {' '.join(missing_linters())}"])
    check(not findings, f"upstream's linters on the PR's {len(py)} Python files: {len(findings)} findings")
    for line in findings[:20]:
        print(f"      {line}")

    problems = registration_problems(ported, [rel for rel in files if rel.endswith("conftest.py")], pr)
    gpu = f"{int(bool(pr.GPU_TEST_FILE))} GPU in {len(pr.GPU_REGISTRATION)} configuration" + "s" * (
        len(pr.GPU_REGISTRATION) != 1)
    check(not problems, f"the PR's tests as upstream's CI runs them ({len(pr.CPU_TEST_FILES)} CPU, {gpu}): "
                        f"{len(problems)} problems")
    for line in problems:
        print(f"      {line}")

    dead = []
    for rel in [r for r in files if r.endswith(".md")]:
        old = set(LINK.findall((pristine / rel).read_text())) if (pristine / rel).exists() else set()
        for target in set(LINK.findall((ported / rel).read_text())) - old:  # upstream's own links are its own
            if not target.startswith(("http://", "https://")) and not (ported / rel).parent.joinpath(target).exists():
                dead.append(f"{rel} -> {target}")
    check(not dead, f"every relative link of the PR's Markdown resolves in the ported tree {dead or ''}")
    print(f"verify_pr.py counts: {', '.join(counts)}")
    print(f"verify_pr.py: {'OK' if not FAILED else f'{len(FAILED)} failed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
