"""The PR read as a maintainer would: its size, its wording, upstream's linters, its own tests and links.

    python tools/slime_pr/verify_pr.py PRISTINE PORTED

* caps (issue 30): the example's Python (``examples/multi_turn_tcod/**/*.py``) at most 1,000 lines, at most
  150 lines added under ``slime/``, at most 2,500 added in all; no upstream file replaced or losing lines;
* no line the PR adds names this repository's runtime (``RUNTIME_NAMES``), each hit reported as file:line;
* upstream's pinned linters (``lint.py``, upstream's settings) on every Python file the PR adds or edits;
* the PR's tests as upstream's CI finds them (``registration_problems``): each CPU test declares
  ``NUM_GPUS = 0``, ends in upstream's ``__main__`` runner and is registered in a CPU job of the ported
  ``pr-test.yml.j2``; the GPU test is registered once per configuration with the GPUs it uses; the PR adds
  no ``conftest.py``. The CPU tests *run* in ``cpu_ci.py`` (verify.sh's CPU-CI step), in upstream's CPU-CI
  environment, with nothing stubbed by this harness: what a test needs stubbed, it stubs itself;
* every relative link of the PR's Markdown files resolves inside the ported tree.

One line per check, then the counts; exit 1 if any check failed.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import cpu_ci, lint, manifest, pr_test_entry  # noqa: E402

MAX_ADDED, MAX_CORE, MAX_EXAMPLE_PY, MAX_REMOVED = 2500, 150, 1000, 5
EXAMPLE_DIR = "examples/multi_turn_tcod/"
GPU_TEST = manifest.GPU_TEST_FILE
MAIN_RUNNER = 'if __name__ == "__main__":\n    raise SystemExit(pytest.main([__file__]))\n'
NUM_GPUS_LINE = re.compile(r"^NUM_GPUS\s*=\s*(\d+)", re.M)  # what upstream's changed-tests job greps
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# What only this repository's runtime has, so no PR file may name it: the repository itself, its CPU demo,
# its environments that do not ship with the example, attributes that only its own flags set (upstream
# would raise AttributeError), its environment package and its second environment contract (make_env).
# Matched case-insensitively as whole words, in the lines the PR adds.
RUNTIME_NAMES = (
    "slime-tcod",
    "hanoi",
    "ScienceWorld",
    "TextWorld",
    "ALFWorld",
    "WebShop",
    "the demo",
    "engine_limits",
    "rollout_engine_urls",
    "tcod_prefix_source",
    "tcod_prefix_replay_path",
    "examples.agent_envs",
    "make_env",
)
_RUNTIME_NAME = re.compile(r"(?<![\w-])(" + "|".join(re.escape(n) for n in RUNTIME_NAMES) + r")(?![\w-])", re.I)
# The paper's benchmarks may be named where a setting is cited to the official TCOD configs (the launch
# script's eta values come from its ALFWorld / ScienceWorld / WebShop YAMLs); nowhere else.
OFFICIAL_BENCHMARKS = {"scienceworld", "alfworld", "webshop"}
OFFICIAL_CITATION = re.compile(r"official|kokolerk/TCOD", re.I)
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


def runtime_name_hits(rel: str, added: list[tuple[int, str]]) -> list[str]:
    """``file:line: 'name'`` for every runtime name on a line the PR adds to ``rel``."""
    hits = []
    for number, text in added:
        for match in _RUNTIME_NAME.finditer(text):
            if match.group(1).lower() in OFFICIAL_BENCHMARKS and OFFICIAL_CITATION.search(text):
                continue
            hits.append(f"{rel}:{number}: {match.group(1)!r}")
    return hits


def registration_problems(ported: Path, conftests: list[str]) -> list[str]:
    """What keeps upstream's CI from running the PR's tests as intended (one line each)."""
    problems = [f"{rel}: the PR adds a conftest.py; a test stubs what it needs itself" for rel in conftests]
    for rel in manifest.TEST_FILES:
        path = ported / rel
        if not path.is_file():
            problems.append(f"{rel}: not in the ported tree")
            continue
        text = path.read_text()
        gpus = NUM_GPUS_LINE.findall(text)
        want = "0" if rel in manifest.CPU_TEST_FILES else str(pr_test_entry.GPU_CONFIGS[0][2])
        if gpus[:1] != [want]:
            problems.append(f"{rel}: NUM_GPUS is {gpus[0] if gpus else 'not set'}, want {want}")
        if rel in manifest.CPU_TEST_FILES and not text.endswith(MAIN_RUNNER):
            problems.append(f"{rel}: does not end with upstream's runner {MAIN_RUNNER.splitlines()[1].strip()!r}")
    try:
        rendered = cpu_ci.render(ported)["jobs"]
        cpu = {rel for job in cpu_ci.cpu_jobs(ported) for rel, _ in job.tests}
    except Exception as err:  # noqa: BLE001 - a template that does not render is itself the finding
        return problems + [f"{pr_test_entry.TEMPLATE} does not render: {type(err).__name__}: {err}"]
    problems += [f"{rel}: not registered in a CPU job" for rel in manifest.CPU_TEST_FILES if rel not in cpu]
    gpu_name = GPU_TEST.removeprefix("tests/")
    want = sorted((f"--tcod-mode {m} --opd-type {o}", n) for m, o, n in pr_test_entry.GPU_CONFIGS)
    registered = False
    for name, job in rendered.items():
        if job.get("runs-on") == "ubuntu-latest":
            continue
        got = sorted((e.get("test_args", ""), e.get("num_gpus")) for e in _matrix_entries(job)
                     if e.get("test_file") == gpu_name)
        registered |= bool(got)
        if got and got != want:
            problems.append(f"{GPU_TEST} in job {name}: entries {got}, want {want}")
    if not registered:
        problems.append(f"{GPU_TEST}: not registered in any GPU job")
    return problems


def _matrix_entries(job) -> list[dict]:
    """A rendered job's ``strategy.matrix.info`` entries ([] for a matrix computed at run time)."""
    matrix = job.get("strategy", {}).get("matrix") if isinstance(job.get("strategy"), dict) else None
    info = matrix.get("info") if isinstance(matrix, dict) else None
    return [e for e in info if isinstance(e, dict)] if isinstance(info, list) else []


def example_python_lines(ported: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in sorted((ported / EXAMPLE_DIR).rglob("*.py")))


def main(argv=None) -> int:
    pristine, ported = (Path(p).resolve() for p in (argv or sys.argv[1:]))
    files = diff_stats(pristine, ported)
    added = sum(len(a) for a, _ in files.values())
    core = sum(len(a) for rel, (a, _) in files.items() if rel.startswith("slime/"))
    example_py = example_python_lines(ported)
    check(example_py <= MAX_EXAMPLE_PY, f"size: the example's Python is {example_py} lines (cap {MAX_EXAMPLE_PY})")
    check(core <= MAX_CORE, f"size: +{core} lines under slime/ (cap {MAX_CORE})")
    check(added <= MAX_ADDED, f"size: {len(files)} files, +{added} lines (cap {MAX_ADDED})")
    shrunk = {rel: r for rel, (_, r) in files.items() if r > MAX_REMOVED or (r and not (ported / rel).exists())}
    check(not shrunk, f"no upstream file replaced or losing more than {MAX_REMOVED} lines {shrunk or ''}")
    hits = [hit for rel, (lines, _) in files.items() for hit in runtime_name_hits(rel, lines)]
    check(not hits, f"no PR line names this repository's runtime (RUNTIME_NAMES): {len(hits)} hits")
    for hit in hits:
        print(f"      {hit}")

    py = [rel for rel in files if rel.endswith(".py")]
    findings = lint.lint([str(ported / rel) for rel in py]) if not lint.missing_linters() else ["linters missing"]
    check(not findings, f"upstream's linters on the PR's {len(py)} Python files: {len(findings)} findings")
    for line in findings[:20]:
        print(f"      {line}")

    problems = registration_problems(ported, [rel for rel in files if rel.endswith("conftest.py")])
    n_cpu = len(manifest.CPU_TEST_FILES)
    check(not problems, f"the PR's tests as upstream's CI runs them ({n_cpu} CPU, 1 GPU in "
                        f"{len(pr_test_entry.GPU_CONFIGS)} configurations): {len(problems)} problems")
    for line in problems:
        print(f"      {line}")

    dead = []
    for rel in [r for r in files if r.endswith(".md")]:
        old = set(LINK.findall((pristine / rel).read_text())) if (pristine / rel).exists() else set()
        for target in set(LINK.findall((ported / rel).read_text())) - old:  # upstream's own links are its own
            if not target.startswith(("http://", "https://")) and not (ported / rel).parent.joinpath(target).exists():
                dead.append(f"{rel} -> {target}")
    check(not dead, f"every relative link of the PR's Markdown resolves in the ported tree {dead or ''}")
    print(f"verify_pr.py counts: example Python {example_py} lines, slime/ +{core} lines, total +{added} lines")
    print(f"verify_pr.py: {'OK' if not FAILED else f'{len(FAILED)} failed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
