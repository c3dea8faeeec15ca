"""Upstream's CPU CI jobs, run here as GitHub runs them, on the pristine and on the ported tree.

    python tools/slime_pr/cpu_ci.py [--pr tcod|adaptive-kl] --pristine P --ported Q --work W [--summary FILE]

The jobs of upstream's ``.github/workflows/pr-test.yml.j2`` that run on ``ubuntu-latest`` (``cpu-unittest``,
``agent-test``) set up Python 3.10, run their ``pip install`` lines, ``pip install -e . --no-deps`` and, for every
registered file, ``python tests/FILE [test_args]`` from the tree's root. This driver does the same in cpu_ci_env.py's
venvs, on copies of both trees (the runs write into them), with the job's environment variables,
``$CPU_CI_TIMEOUT`` seconds a file (default 1800), ``$CPU_CI_PARALLEL`` at a time (default 2). ported/ must pass
every file pristine/ passes; the PR's CPU tests (its ``CPU_TEST_FILES``) must be registered in a CPU job and end in
``N passed``, nothing skipped, failed or deselected. One row per file, then a one-line summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import port  # noqa: E402
from tools.slime_pr.cpu_ci_env import CIError, build_envs, run_file, say, tail, tree_venv  # noqa: E402
from tools.slime_pr.trees import copy_tree  # noqa: E402

TEMPLATE = port.TEMPLATE


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

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str((tree / TEMPLATE).parent)), block_start_string="<%",
                             block_end_string="%>", variable_start_string="<<", variable_end_string=">>")
    return yaml.safe_load(env.get_template(Path(TEMPLATE).name).render())


def cpu_jobs(tree: Path) -> list[Job]:
    jobs = []
    for name, job in render(tree)["jobs"].items():
        if job.get("runs-on") != "ubuntu-latest":
            continue
        steps = {s.get("name"): s for s in job.get("steps", [])}
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
            path = info["test_file"] if info["test_file"].startswith("tests/") else f"tests/{info['test_file']}"
            if str(info.get("num_gpus")) != "0":
                raise CIError(f"{TEMPLATE}: CPU job {name} registers {path} with num_gpus {info.get('num_gpus')}")
            tests.append((path, info.get("test_args") or ""))
        jobs.append(Job(name, str(steps["Set up Python"]["with"]["python-version"]), tuple(pip), tuple(tests)))
    if not jobs:
        raise CIError(f"{tree}/{TEMPLATE} has no job that runs on ubuntu-latest")
    return jobs


def registration_problems(jobs_p: list[Job], jobs_q: list[Job], pr_files: set[str]) -> list[str]:
    """The ported template keeps upstream's CPU entries and jobs, and adds exactly the PR's CPU tests."""
    reg_p = {(j.name, rel, a) for j in jobs_p for rel, a in j.tests}
    reg_q = {(j.name, rel, a) for j in jobs_q for rel, a in j.tests}
    problems = [f"the ported template drops upstream's CPU entry {missing}" for missing in sorted(reg_p - reg_q)]
    problems += [f"the PR's CPU test {rel} is not registered in a CPU job of the ported {TEMPLATE}"
                 for rel in sorted(pr_files - {r for _, r, _ in reg_q})]
    problems += [f"the ported template registers {rel} in {job}, which is not one of the PR's CPU tests"
                 for job, rel, _ in sorted(reg_q - reg_p) if rel not in pr_files]
    if [(j.name, j.python, j.pip) for j in jobs_p] != [(j.name, j.python, j.pip) for j in jobs_q]:
        problems.append("the ported template changes a CPU job's Python or pip lines")
    return problems


def run_all(jobs: list[Job], envs: dict, trees: dict[str, Path], work: Path, reg_p: set) -> dict:
    """{(job, rel, args, tree label): Result}: upstream's registered files (``reg_p``) on both trees, the PR's on
    ported/."""
    timeout = int(os.environ.get("CPU_CI_TIMEOUT", "1800"))
    parallel = max(1, int(os.environ.get("CPU_CI_PARALLEL", "2")))
    say(f"installing copies of both trees ({work / 'trees'}): pip install -e . --no-deps, one throwaway venv "
        "per job and tree ...")
    t0 = time.monotonic()
    venvs = {}
    with open(work / "install.log", "w") as log:
        for job in jobs:
            for label, tree in trees.items():
                venvs[job.name, label] = tree_venv(work, envs[job.name], tree, f"{job.name}-{label}", log)
    say(f"  ({time.monotonic() - t0:.0f}s)")
    # The pristine tree's files, then the ported tree's, so that a file's two runs (some start 8 worker
    # processes) do not share the cores.
    tasks = [(j.name, rel, a, "pristine") for j in jobs for rel, a in j.tests if (j.name, rel, a) in reg_p]
    tasks += [(j.name, rel, a, "ported") for j in jobs for rel, a in j.tests]
    (work / "logs").mkdir(exist_ok=True)
    say(f"running {len(tasks)} files ({parallel} at a time, {timeout}s each) ...")

    def one(task):
        job, rel, args, label = task
        name = re.sub(r"[^\w.-]+", "_", f"{job}-{label}-{rel.removeprefix('tests/')}" + (f"-{args}" if args else ""))
        return task, run_file(venvs[job, label], trees[label], rel, args, work / "logs" / f"{name}.log", timeout)

    with ThreadPoolExecutor(parallel) as pool:
        return dict(pool.map(one, tasks))


def verdict(p, q, is_pr: bool) -> str:
    if is_pr:
        return "ok (PR)" if q.strict else "FAIL (PR test must end in `N passed`, nothing skipped)"
    if p is None:
        return "FAIL (not registered upstream, not the PR's)"
    if p.passed:
        if not q.passed:
            return "FAIL (passes on pristine)"
        return "ok (other counts than pristine)" if p.counts.get("passed") != q.counts.get("passed") else "ok"
    return "fails upstream too" if not q.passed else "ok (fails on pristine)"


def cmd_run(ns) -> int:
    pristine, ported, work = (Path(p).resolve() for p in (ns.pristine, ns.ported, ns.work))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    jobs_p, jobs_q = cpu_jobs(pristine), cpu_jobs(ported)
    reg_p = {(j.name, rel, a) for j in jobs_p for rel, a in j.tests}
    pr_files = set(port.manifest_of(ns.pr).CPU_TEST_FILES)
    problems = registration_problems(jobs_p, jobs_q, pr_files)

    say("CPU-CI environments (built once, then cached):")
    envs, torch = build_envs(jobs_q)
    say(f"  ({time.monotonic() - t_start:.0f}s)")
    trees = {"pristine": work / "trees" / "pristine", "ported": work / "trees" / "ported"}
    for label, given in (("pristine", pristine), ("ported", ported)):  # verify.sh's later steps keep theirs
        shutil.rmtree(trees[label], ignore_errors=True)
        copy_tree(given, trees[label])
    t_run = time.monotonic()
    results = run_all(jobs_q, envs, trees, work, reg_p)
    run_seconds = time.monotonic() - t_run

    rows, fails, shared_fails = [], [], []
    for job in jobs_q:
        for rel, args in job.tests:
            p, q = results.get((job.name, rel, args, "pristine")), results[(job.name, rel, args, "ported")]
            is_pr = rel in pr_files and (job.name, rel, args) not in reg_p
            v = verdict(p, q, is_pr)
            if v.startswith("FAIL"):
                fails.append((job.name, rel, args, p, q))
            elif v == "fails upstream too":
                shared_fails.append((job.name, rel, args, p, q))
            rows.append((job.name, rel + (f" {args}" if args else "") + (" [PR]" if is_pr else ""),
                         p.label() if p else "-", q.label(), v))

    heads = ("JOB", "FILE", "PRISTINE", "PORTED")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    header = "  ".join(h.ljust(w) for h, w in zip(heads, widths)) + "  VERDICT"
    say("\nUpstream's CPU CI jobs, `python tests/FILE` from each tree's root in the job's Python 3.10 venv:")
    say(header + "\n" + "-" * len(header))
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
                        say(tail(res.log))
    for p in problems:
        say(f"PROBLEM: {p}")

    upstream_rows = [r for r in rows if not r[1].endswith("[PR]")]
    pr_rows = [r for r in rows if r[1].endswith("[PR]")]
    n_pristine_pass = sum(1 for (_, _, _, lab), res in results.items() if lab == "pristine" and res.passed)
    n_kept = sum(1 for r in upstream_rows if r[4].startswith("ok") and not r[4].endswith("(fails on pristine)"))
    pr_ok = sum(1 for r in pr_rows if r[4] == "ok (PR)")
    summary = (f"py3.10 torch {torch}: pristine {n_pristine_pass}/{len(upstream_rows)} files pass, ported keeps "
               f"{n_kept}/{n_pristine_pass}, PR tests {pr_ok}/{len(pr_rows)}")
    if shared_fails:
        summary += f", {len(shared_fails)} failing upstream too"
    failed = bool(fails or problems)
    say(f"\ncpu-ci: {summary}; runs {run_seconds:.0f}s, total {time.monotonic() - t_start:.0f}s"
        + (" -> FAILED" if failed else " -> OK"))
    if ns.summary:
        Path(ns.summary).write_text(summary + (f", {len(problems)} problem(s)" if problems else "") + "\n")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cpu_ci.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pr", choices=tuple(port.PRS), default="tcod", help="whose CPU tests are the PR's")
    for name in ("--pristine", "--ported", "--work"):
        p.add_argument(name, required=True)
    p.add_argument("--summary", help="write the one-line summary here")
    ns = p.parse_args(argv)
    try:
        return cmd_run(ns)
    except CIError as err:
        say(f"cpu_ci.py: ERROR: {err}")
        if ns.summary:
            Path(ns.summary).write_text(f"ERROR: {str(err).splitlines()[0][:200]}\n")
        return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
