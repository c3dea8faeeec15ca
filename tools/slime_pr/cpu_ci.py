"""Upstream's CPU CI jobs, run here as GitHub runs them, on the pristine and on the ported tree.

    python tools/slime_pr/cpu_ci.py jobs TREE
    python tools/slime_pr/cpu_ci.py env TREE
    python tools/slime_pr/cpu_ci.py run --pristine P --ported Q --work W [--summary FILE]

Upstream's ``.github/workflows/pr-test.yml.j2`` (rendered here with upstream's generator settings) has
jobs that run on ``ubuntu-latest`` (``'cpu': True``: ``cpu-unittest``, ``agent-test``). Each sets up
Python 3.10, runs its ``pip install`` lines (torch, a list common to the CPU jobs, then the job's
``extra_pip_deps``), ``pip install -e . --no-deps``, and for every registered file ``python tests/FILE
[test_args]`` from the tree's root. This driver reproduces that:

``jobs TREE``  the CPU jobs of TREE's template: Python version, pip lines, test files.

``env TREE``   builds (once; cached) a Python 3.10 virtualenv per job with exactly its pip lines, under
    ``$CPU_CI_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/slime-tcod/cpu-ci``): a base venv holding
    the lines every CPU job shares, and for a job with more lines a venv layered on it (a ``.pth`` that
    adds the base's site-packages after its own; pip installs the job's extras into the layer and, in a
    virtualenv, never uninstalls what lies outside it). A directory's name carries a hash of its pip
    lines, so another template gets another venv; ``CPU_CI_REBUILD=1`` rebuilds. When
    download.pytorch.org (the template's torch index) cannot be reached, torch comes from PyPI
    (``$CPU_CI_TORCH``, default ``torch==2.13.0``): the CUDA build with its nvidia-* wheels (about
    4.6 GB), which runs on CPU; the output says so.

``run``        for each tree a throwaway venv layered on each job's venv gets ``pip install -e .
    --no-deps`` of that tree (so the cached venvs never hold a tree, and both trees can run at once);
    every file a CPU job registers runs as ``python tests/FILE`` from the tree's root, with the job's
    environment variables, ``$CPU_CI_TIMEOUT`` seconds each (default 1800), ``$CPU_CI_PARALLEL`` at a
    time (default 2). The ported tree must pass every file the pristine one passes; the PR's own CPU
    tests (``manifest.CPU_TEST_FILES``) must be registered in a CPU job and end in ``N passed`` with
    nothing skipped, failed or deselected. Prints one row per file and a one-line summary.

``PY310``      the Python 3.10 interpreter (default: ``python3.10`` on PATH, else pyenv's newest 3.10).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import manifest  # noqa: E402
from tools.slime_pr.cpu_ci_files import Result, _tail, parse_counts, run_file  # noqa: E402,F401 - tests use them
from tools.slime_pr.verify_trees import copy_tree  # noqa: E402

TEMPLATE = ".github/workflows/pr-test.yml.j2"
TORCH_INDEX_PROBE = "https://download.pytorch.org/whl/cpu/torch/"
DEFAULT_TORCH = "torch==2.13.0"
PIP_NOISE = ("is ignored: it is neither a file nor a directory", "[notice]", "DEPRECATION:")
MARKER = ".slime-tcod-complete"


def say(msg: str = "") -> None:
    print(msg, flush=True)


class CIError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------- the jobs
@dataclasses.dataclass(frozen=True)
class Job:
    name: str
    python: str  # setup-python's python-version
    pip: tuple[tuple[str, ...], ...]  # argv after `pip install`, one per line of "Install dependencies"
    tests: tuple[tuple[str, str], ...]  # (tests/FILE, test_args)


def render(tree: Path) -> dict:
    """The template rendered as upstream's generate_github_workflows.py renders it, parsed."""
    import jinja2
    import yaml

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str((tree / TEMPLATE).parent)),
        block_start_string="<%",
        block_end_string="%>",
        variable_start_string="<<",
        variable_end_string=">>",
    )
    return yaml.safe_load(env.get_template(Path(TEMPLATE).name).render())


def cpu_jobs(tree: Path) -> list[Job]:
    jobs = []
    for name, job in render(tree)["jobs"].items():
        if job.get("runs-on") != "ubuntu-latest":
            continue
        steps = {s.get("name"): s for s in job.get("steps", [])}
        python = str(steps["Set up Python"]["with"]["python-version"])
        pip = []
        for line in steps["Install dependencies"]["run"].splitlines():
            words = shlex.split(line)
            if words[:2] == ["pip", "install"]:
                pip.append(tuple(words[2:]))
            elif words:
                raise CIError(f"{TEMPLATE}: job {name}: unexpected install line {line!r}")
        install = steps["Install"]["run"]
        if "pip install -e . --no-deps" not in install:
            raise CIError(f"{TEMPLATE}: job {name} does not `pip install -e . --no-deps` ({install!r})")
        tests = []
        for info in job["strategy"]["matrix"]["info"]:
            path = info["test_file"]
            path = path if path.startswith("tests/") else f"tests/{path}"
            if str(info.get("num_gpus")) != "0":
                raise CIError(f"{TEMPLATE}: CPU job {name} registers {path} with num_gpus {info.get('num_gpus')}")
            tests.append((path, info.get("test_args") or ""))
        jobs.append(Job(name, python, tuple(pip), tuple(tests)))
    if not jobs:
        raise CIError(f"{tree}/{TEMPLATE} has no job that runs on ubuntu-latest")
    return jobs


# ------------------------------------------------------------------------------------------ the venvs
def find_py310(version: str) -> str:
    want = os.environ.get("PY310")
    candidates = [want] if want else []
    if not want:
        candidates += [shutil.which(f"python{version}") or ""]
        pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        candidates += [str(p / "bin/python") for p in sorted(pyenv.glob(f"{version}.*"), reverse=True)]
    for c in filter(None, candidates):
        try:
            out = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return c
        if want:
            raise CIError(f"PY310={want} is Python {out.stdout.strip() or '?'}, not {version}")
    raise CIError(f"no Python {version} found (the CPU jobs' setup-python version); set PY310 to one")


def _torch_index_reachable() -> bool:
    try:
        with urllib.request.urlopen(TORCH_INDEX_PROBE, timeout=5):
            return True
    except Exception:
        return False


def effective_pip(lines, reachable: bool | None = None) -> tuple[list[tuple[str, ...]], list[str]]:
    """The pip lines as run here, and notes on what differs from the template."""
    out, notes = [], []
    for words in lines:
        if "--index-url" in words and words[0] == "torch":
            if reachable is None:
                reachable = _torch_index_reachable()
            if not reachable:
                torch = os.environ.get("CPU_CI_TORCH", DEFAULT_TORCH)
                i = words.index("--index-url")
                template_line = " ".join(words)
                words = (torch, *words[1:i], *words[i + 2 :])
                notes.append(
                    f"download.pytorch.org is not reachable from here: `pip install {template_line}` runs as "
                    f"`pip install {' '.join(words)}` from PyPI, which is the CUDA build (with its nvidia-* wheels, "
                    "about 4.6 GB); it runs on CPU as the CPU build does (set CPU_CI_TORCH for another pin)"
                )
        out.append(tuple(words))
    return out, notes


def _site(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise CIError(f"{venv} has no lib/python3*/site-packages")
    return found[0]


def _pip(python: Path, words, cwd: Path | None = None, log=None) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *words]
    say(f"  $ pip install {' '.join(words)}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    text = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines() if not any(n in ln for n in PIP_NOISE))
    if log is not None:
        log.write(f"$ {' '.join(cmd)}\n{text}\n")
    if proc.returncode != 0:
        raise CIError(f"pip install {' '.join(words)} failed (exit {proc.returncode}):\n" + "\n".join(
            "    " + ln for ln in text.splitlines()[-25:]))
    done = [ln for ln in text.splitlines() if ln.startswith("Successfully installed")]
    say(f"    {time.monotonic() - t0:.0f}s; " + (done[-1][:300] if done else "nothing new to install"))


def _layer(venv: Path, below: Path) -> None:
    """Put ``below``'s site-packages (and what its .pth files add) on ``venv``'s path, after its own."""
    line = f"import site; site.addsitedir({str(_site(below))!r})\n"
    (_site(venv) / "_slime_tcod_layer.pth").write_text(line)


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def cache_root() -> Path:
    if os.environ.get("CPU_CI_CACHE"):
        return Path(os.environ["CPU_CI_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "slime-tcod" / "cpu-ci"


def _build(venv: Path, py: str, lines, below: Path | None, what: str, force: bool = False) -> bool:
    """Build ``venv`` unless it is complete already; returns whether it was (re)built."""
    if (venv / MARKER).is_file() and not force and os.environ.get("CPU_CI_REBUILD") != "1":
        say(f"{what}: cached {venv}")
        return False
    if os.environ.get("VERIFY_NO_INSTALL") == "1":
        raise CIError(f"{what}: {venv} is not built and VERIFY_NO_INSTALL=1 forbids installing")
    shutil.rmtree(venv, ignore_errors=True)
    say(f"{what}: building {venv}")
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    if below is not None:
        _layer(venv, below)
    with open(venv / "pip-install.log", "w") as log:
        for words in lines:
            _pip(venv / "bin/python", words, log=log)
    freeze = subprocess.run([str(venv / "bin/python"), "-m", "pip", "list", "--format=freeze",
                             "--disable-pip-version-check"], capture_output=True, text=True).stdout
    (venv / MARKER).write_text(json.dumps({"pip": [list(w) for w in lines], "below": str(below or "")}) + "\n" + freeze)
    return True


def build_envs(jobs: list[Job]) -> dict[str, Path]:
    """{job name: its venv}, built when absent. The lines all CPU jobs begin with go into one base venv."""
    versions = {j.python for j in jobs}
    if len(versions) != 1:
        raise CIError(f"the CPU jobs set up different Pythons ({sorted(versions)}); this driver expects one")
    version = versions.pop()
    py = find_py310(version)
    pyver = subprocess.run([py, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                           text=True, check=True).stdout.strip()
    shared = 0
    while all(len(j.pip) > shared for j in jobs) and len({j.pip[shared] for j in jobs}) == 1:
        shared += 1
    base_lines, notes = effective_pip(jobs[0].pip[:shared])
    say(f"Python {pyver} ({py}); cache {cache_root()}")
    for note in notes:
        say(f"NOTE: {note}")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    envs = {}
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another verify.sh building the same cache waits here
        base = root / f"py{version}-base-{_key(pyver, base_lines)}"
        rebuilt = _build(base, py, base_lines, None,
                         f"base venv ({shared} pip lines shared by {', '.join(j.name for j in jobs)})")
        for job in jobs:
            extra, _ = effective_pip(job.pip[shared:], reachable=True)
            if not extra:
                envs[job.name] = base
                continue
            venv = root / f"py{version}-{job.name}-{_key(pyver, base_lines, extra)}"
            # A layer resolved against an older base is rebuilt with it.
            _build(venv, py, extra, base, f"{job.name} venv (base + {len(extra)} pip line(s))", force=rebuilt)
            envs[job.name] = venv
    torch = subprocess.run([str(envs[jobs[0].name] / "bin/python"), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    say(f"torch in the CPU-CI venvs: {torch.stdout.strip() or 'NOT IMPORTABLE: ' + torch.stderr.strip()[-300:]}")
    for job in jobs:
        say(f"  {job.name}: {envs[job.name]}  (pip: " + "; ".join(" ".join(w) for w in job.pip) + ")")
    return envs


def tree_venv(work: Path, job_venv: Path, tree: Path, label: str, log) -> Path:
    """A venv of ``tree`` on top of ``job_venv``: `pip install -e . --no-deps` from the tree's root."""
    venv = work / f"venv-{label}"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([str(job_venv / "bin/python"), "-m", "venv", "--without-pip", str(venv)], check=True)
    _layer(venv, job_venv)
    cmd = [str(job_venv / "bin/python"), "-m", "pip", "--python", str(venv / "bin/python"), "install",
           "--disable-pip-version-check", "-e", ".", "--no-deps"]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    log.write(f"$ (cd {tree} && pip install -e . --no-deps)  [{venv}]\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise CIError(f"pip install -e . --no-deps failed in {tree} (exit {proc.returncode}): {proc.stderr[-800:]}")
    return venv


def cmd_run(ns) -> int:
    pristine, ported, work = (Path(p).resolve() for p in (ns.pristine, ns.ported, ns.work))
    work.mkdir(parents=True, exist_ok=True)
    timeout = int(os.environ.get("CPU_CI_TIMEOUT", "1800"))
    parallel = max(1, int(os.environ.get("CPU_CI_PARALLEL", "2")))
    problems: list[str] = []
    t_start = time.monotonic()

    jobs_p, jobs_q = cpu_jobs(pristine), cpu_jobs(ported)
    reg_p = {(j.name, rel, a) for j in jobs_p for rel, a in j.tests}
    reg_q = {(j.name, rel, a) for j in jobs_q for rel, a in j.tests}
    if getattr(ns, "pr", "tcod") == "adaptive-kl":
        from tools.slime_pr import manifest_adaptive_kl as pr_manifest
    else:
        pr_manifest = manifest
    pr_files = set(pr_manifest.CPU_TEST_FILES)
    for missing in sorted(reg_p - reg_q):
        problems.append(f"the ported template drops upstream's CPU entry {missing}")
    for rel in sorted(pr_files - {r for _, r, _ in reg_q}):
        problems.append(f"the PR's CPU test {rel} is not registered in a CPU job of the ported {TEMPLATE}")
    for job, rel, _ in sorted(reg_q - reg_p):
        if rel not in pr_files:
            problems.append(f"the ported template registers {rel} in {job}, which is not one of the PR's CPU tests")
    if [(j.name, j.python, j.pip) for j in jobs_p] != [(j.name, j.python, j.pip) for j in jobs_q]:
        problems.append("the ported template changes a CPU job's Python or pip lines")

    say("CPU-CI environments (built once, then cached):")
    envs = build_envs(jobs_q)
    say(f"  ({time.monotonic() - t_start:.0f}s)")

    # The runs write into the trees (slime.egg-info, caches, test outputs): they get copies, so the later
    # steps of verify.sh see pristine/ and ported/ as port.py left them.
    given = {"pristine": pristine, "ported": ported}
    pristine, ported = work / "trees" / "pristine", work / "trees" / "ported"
    for label, dst in (("pristine", pristine), ("ported", ported)):
        shutil.rmtree(dst, ignore_errors=True)
        copy_tree(given[label], dst)
    say(f"installing copies of both trees ({work / 'trees'}): pip install -e . --no-deps, one throwaway venv "
        "per job and tree ...")
    t_install = time.monotonic()
    tree_venvs = {}
    with open(work / "install.log", "w") as log:
        for job in jobs_q:
            for label, tree in (("pristine", pristine), ("ported", ported)):
                tree_venvs[job.name, label] = tree_venv(work, envs[job.name], tree, f"{job.name}-{label}", log)
    say(f"  ({time.monotonic() - t_install:.0f}s)")

    # (job, rel, args, tree label): the pristine tree's files, then the ported tree's, so that a file's two
    # runs (some start 8 worker processes) do not share the cores.
    tasks = [(job.name, rel, args, "pristine") for job in jobs_q for rel, args in job.tests
             if (job.name, rel, args) in reg_p]
    tasks += [(job.name, rel, args, "ported") for job in jobs_q for rel, args in job.tests]
    (work / "logs").mkdir(exist_ok=True)
    say(f"running {len(tasks)} files ({parallel} at a time, {timeout}s each) ...")
    t_run = time.monotonic()

    def one(task):
        job, rel, args, label = task
        tree = pristine if label == "pristine" else ported
        name = re.sub(r"[^\w.-]+", "_", f"{job}-{label}-{rel.removeprefix('tests/')}" + (f"-{args}" if args else ""))
        return task, run_file(tree_venvs[job, label], tree, rel, args, work / "logs" / f"{name}.log", timeout)

    results = {}
    with ThreadPoolExecutor(parallel) as pool:
        for task, res in pool.map(one, tasks):
            results[task] = res
    run_seconds = time.monotonic() - t_run

    rows, fails, shared_fails = [], [], []
    for job in jobs_q:
        for rel, args in job.tests:
            p = results.get((job.name, rel, args, "pristine"))
            q = results[(job.name, rel, args, "ported")]
            pr = rel in pr_files and (job.name, rel, args) not in reg_p
            if pr:
                verdict = "ok (PR)" if q.strict else "FAIL (PR test must end in `N passed`, nothing skipped)"
            elif p is None:
                verdict = "FAIL (not registered upstream, not the PR's)"
            elif p.passed:
                verdict = "ok" if q.passed else "FAIL (passes on pristine)"
                if q.passed and p.counts.get("passed") != q.counts.get("passed"):
                    verdict = "ok (other counts than pristine)"
            else:
                verdict = "fails upstream too" if not q.passed else "ok (fails on pristine)"
            if verdict.startswith("FAIL"):
                fails.append((job.name, rel, args, p, q))
            elif verdict == "fails upstream too":
                shared_fails.append((job.name, rel, args, p, q))
            rows.append((job.name, rel + (f" {args}" if args else "") + (" [PR]" if pr else ""),
                         p.label() if p else "-", q.label(), verdict))

    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("JOB", "FILE", "PRISTINE", "PORTED"))]
    header = "  ".join(h.ljust(w) for h, w in zip(("JOB", "FILE", "PRISTINE", "PORTED"), widths)) + "  VERDICT"
    say("")
    say("Upstream's CPU CI jobs, `python tests/FILE` from each tree's root in the job's Python 3.10 venv:")
    say(header)
    say("-" * len(header))
    for r in rows:
        say("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    for title, items in (("Failures", fails), ("Failing on the pristine tree too (upstream's, not the PR's)",
                                                 shared_fails)):
        if items:
            say(f"\n{title}:")
        for job, rel, args, p, q in items:
            say(f"  {job} {rel} {args}".rstrip())
            for label, res in (("pristine", p), ("ported", q)):
                if res is not None and (not res.strict or label == "ported"):
                    say(f"    {label}: {res.label()}  log {res.log}")
                    if not res.passed or (label == "ported" and not res.strict):
                        say(_tail(res.log))
    for p in problems:
        say(f"PROBLEM: {p}")

    upstream_rows = [r for r in rows if not r[1].endswith("[PR]")]
    n_pristine_pass = sum(1 for (j, rel, a, lab), res in results.items() if lab == "pristine" and res.passed)
    n_kept = sum(1 for r in upstream_rows if r[4].startswith("ok") and not r[4].endswith("(fails on pristine)"))
    pr_rows = [r for r in rows if r[1].endswith("[PR]")]
    pr_ok = sum(1 for r in pr_rows if r[4] == "ok (PR)")
    torch = _torch_version(envs[jobs_q[0].name])
    summary = (f"py3.10 torch {torch}: pristine {n_pristine_pass}/{len(upstream_rows)} files pass, ported keeps "
               f"{n_kept}/{n_pristine_pass}, PR tests {pr_ok}/{len(pr_rows)}")
    silent = sum(1 for (j, rel, a, lab), res in results.items() if lab == "pristine" and res.passed and not res.counts)
    if silent:
        say(f"note: {silent} of upstream's registered files exit 0 without running a test (no pytest runner in "
            "`__main__`); upstream's CI passes them the same way")
    if shared_fails:
        summary += f", {len(shared_fails)} failing upstream too"
    failed = bool(fails or problems)
    say("")
    say(f"cpu-ci: {summary}; runs {run_seconds:.0f}s, total {time.monotonic() - t_start:.0f}s"
        + (" -> FAILED" if failed else " -> OK"))
    if ns.summary:
        Path(ns.summary).write_text(summary + (f", {len(problems)} problem(s)" if problems else "") + "\n")
    return 1 if failed else 0


def _torch_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin/python"), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cpu_ci.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("jobs", help="list the CPU jobs of a tree's template").add_argument("tree")
    sub.add_parser("env", help="build (or find cached) the CPU jobs' venvs").add_argument("tree")
    s = sub.add_parser("run", help="run the CPU jobs' files on both trees")
    s.add_argument("--pristine", required=True)
    s.add_argument("--ported", required=True)
    s.add_argument("--work", required=True)
    s.add_argument("--summary")
    s.add_argument("--pr", choices=("tcod", "adaptive-kl"), default="tcod", help="whose CPU tests are the PR's")
    ns = p.parse_args(argv)
    try:
        if ns.cmd == "jobs":
            for job in cpu_jobs(Path(ns.tree)):
                say(f"{job.name}: Python {job.python}")
                for words in job.pip:
                    say(f"  pip install {' '.join(words)}")
                for rel, args in job.tests:
                    say(f"  python {rel} {args}".rstrip())
            return 0
        if ns.cmd == "env":
            build_envs(cpu_jobs(Path(ns.tree)))
            return 0
        return cmd_run(ns)
    except CIError as err:
        say(f"cpu_ci.py: ERROR: {err}")
        if ns.cmd == "run" and ns.summary:
            Path(ns.summary).write_text(f"ERROR: {str(err).splitlines()[0][:200]}\n")
        return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
