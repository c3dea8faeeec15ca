#!/usr/bin/env python3
"""Upstream slime's own CPU tests and plugin contracts, run on the TCOD PR's ported tree (verify.sh's step 2).

    python tools/slime_pr/contracts.py deps --tree PRISTINE [--no-install]
    python tools/slime_pr/contracts.py matrix --pristine P --ported Q --work W [--summary FILE]

``deps`` makes this Python able to import what those tests import (upstream_tests.py). ``matrix`` runs
``UPSTREAM_TESTS`` (tests/test_sample.py, tests/test_rollout_metrics.py, tests/test_megatron_argument_validation.py:
``slime_validate_args``, and tests/plugin_contracts/) on both trees. On ``ported/`` the ``SLIME_CONTRACT_*``
variables point at the PR's hooks; on ``pristine/`` at upstream's own counterpart of each hook (``HOOKS``). Every
test gets a verdict (``LEGEND``; a FAIL-SHARED test asks for something upstream's own hooks of that kind do not do
either). Exit status 1 on any FAIL-OURS or FAIL-BOTH, or if a hook's contract test is missing upstream. The internal
``_pytest --results JSON -- PYTEST_ARGS`` is one recorded pytest session in the current directory (a tree).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from .trees import ENV_PREFIX, say, tail, tree_digest, tree_env
    from .upstream_tests import UPSTREAM_TESTS, ensure_deps, has_module, run_session
except ImportError:  # run as a script from this folder
    from trees import ENV_PREFIX, say, tail, tree_digest, tree_env
    from upstream_tests import UPSTREAM_TESTS, ensure_deps, has_module, run_session


# ---------------------------------------------------------------------------- which hook each contract test loads
GENERATE = "tests/plugin_contracts/test_plugin_generate_contracts.py"
PATH_LOADING = "tests/plugin_contracts/test_plugin_path_loading_contracts.py"
RUNTIME_HOOK = "tests/plugin_contracts/test_plugin_runtime_hook_contracts.py"
OPD_RM = "slime.rollout.on_policy_distillation.reward_func"
OPD_POST = "slime.rollout.on_policy_distillation.post_process_rewards"


@dataclass(frozen=True)
class Hook:
    env_key: str  # SLIME_CONTRACT_<env_key>
    ours: str  # path on the ported tree
    theirs: str  # upstream's own counterpart, on the pristine tree
    theirs_label: str
    test_id: str  # the contract test that loads the path
    expected: str  # why upstream's own counterpart fails it too (printed for FAIL-SHARED)
    extra_env: tuple[tuple[str, str], ...] = ()
    suffix: str = ""  # distinguishes a second run of the same test id


GEO3K = "examples.geo3k_vlm_multi_turn.rollout.generate"
HOOKS = [
    Hook("CUSTOM_GENERATE_FUNCTION_PATH", "examples.multi_turn_tcod.rollout.generate", GEO3K, GEO3K,
         f"{GENERATE}::test_custom_generate_function_path_supports_user_override",
         "the contract calls generate with a bare Args (none of the hook's own flags) and no engine to talk "
         "to; upstream's own multi-turn generate (geo3k) needs both too"),
    Hook("CUSTOM_RM_PATH", OPD_RM, OPD_RM, f"{OPD_RM} (upstream's file)",
         f"{PATH_LOADING}::test_custom_rm_path_aligns_with_expected_format",
         "an OPD reward is the teacher's scored reply, which needs a teacher server (--rm-url); upstream's own "
         "OPD reward_func cannot return a float without one either"),
    Hook("CUSTOM_RM_PATH", OPD_RM, OPD_RM, f"{OPD_RM} (upstream's file)",
         f"{PATH_LOADING}::test_custom_rm_path_aligns_with_expected_format",
         "with GROUP_RM the contract wants parameters (args, samples); OPD's reward_func is per sample "
         "(args, sample, **kwargs) in upstream as here, and needs a teacher server to score anything",
         extra_env=(("GROUP_RM", "1"),), suffix=" [GROUP_RM=1]"),
    Hook("CUSTOM_REWARD_POST_PROCESS_PATH", OPD_POST, OPD_POST, f"{OPD_POST} (upstream's file)",
         f"{RUNTIME_HOOK}::test_runtime_hook_path_aligns_with_expected_format[custom_reward_post_process]",
         "the contract wants exactly (args, samples) and float rewards in the samples; OPD's post-process "
         "takes **kwargs like upstream's own, and expects teacher replies in sample.reward"),
]

# The other SLIME_CONTRACT_* keys upstream's contract files read: this contribution has no hook for them,
# so they stay unset and those tests check upstream's own reference hooks on both trees. The PR has no
# rollout or eval function of its own: upstream's default generate_rollout calls its agent loop.
OTHER_CONTRACT_KEYS = ("ROLLOUT_FUNCTION_PATH", "EVAL_FUNCTION_PATH", "DYNAMIC_SAMPLING_FILTER_PATH",
                       "BUFFER_FILTER_PATH", "DATA_SOURCE_PATH", "ROLLOUT_SAMPLE_FILTER_PATH",
                       "ROLLOUT_ALL_SAMPLES_PROCESS_PATH", "CUSTOM_ROLLOUT_LOG_FUNCTION_PATH",
                       "CUSTOM_EVAL_ROLLOUT_LOG_FUNCTION_PATH", "CUSTOM_CONVERT_SAMPLES_TO_TRAIN_DATA_PATH",
                       "ROLLOUT_DATA_POSTPROCESS_PATH")


# ---------------------------------------------------------------------------- the matrix
LEGEND = """\
PASS         passes on the ported tree (with our hook where the test has one)
FAIL-SHARED  upstream's own counterpart fails it too, and ours gets at least as far into the test
FAIL-OURS    upstream's own passes, or ours stops at an earlier point of the test: a real problem
FAIL-BOTH    a test without a hook that fails on the pristine tree too (environment); still a failure"""


def _run_recorded(tree: Path, results: Path, log: Path, env_vars: dict[str, str], pytest_args: list[str],
                  timeout: int) -> dict:
    env = tree_env(tree, {ENV_PREFIX + k: v for k, v in env_vars.items()})
    args = ["-p", "no:cacheprovider", "-rfE", "--tb=short", "--continue-on-collection-errors"]
    if has_module("pytest_timeout"):
        args += ["--timeout", str(max(30, timeout // 2))]
    cmd = [sys.executable, str(Path(__file__).resolve()), "_pytest", "--results", str(results), "--", *args,
           *pytest_args]
    with open(log, "w") as fh:
        fh.write("env: " + " ".join(f"{ENV_PREFIX}{k}={v}" for k, v in env_vars.items()) + "\n")
        fh.write("cmd: " + " ".join(cmd) + f"\ncwd: {tree}\n\n")
        fh.flush()
        try:
            rc = subprocess.run(cmd, cwd=tree, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0 or not results.exists():
        data = json.loads(results.read_text()) if results.exists() else {}
        reason = data.get("fatal") or f"pytest driver ended with {rc}; see {log}"
        say(f"  ERROR running tests in {tree.name}/: {reason}")
        say(tail(log.read_text(errors="replace"), 25))
        return {"fatal": reason, "tests": {}, "collect_errors": {}}
    return json.loads(results.read_text())


def _result_for(data: dict, test_id: str) -> dict:
    """A test's record; a test that never ran (its file failed to import, or the run crashed) is an error."""
    if test_id in data.get("tests", {}):
        return data["tests"][test_id]
    file = test_id.split("::")[0]
    for nodeid, err in data.get("collect_errors", {}).items():
        if nodeid == file or file.startswith(nodeid.rstrip("/") + "/") or nodeid == "":
            return {"outcome": "error", "stage": "collect", "exception": f"collection failed: {err}",
                    "progress": [0], "where": f"importing {file}"}
    reason = data.get("fatal") or "not collected"
    return {"outcome": "error", "stage": "collect", "exception": reason, "progress": [0], "where": "-"}


def _stopped_earlier(ours: dict, theirs: dict) -> bool:
    """Did our run of the test stop at an earlier point of the test file than upstream's counterpart?"""
    a, b = ours.get("progress") or [0], theirs.get("progress") or [0]
    # The first place the two paths differ decides; the same point, or one path a prefix of the other: not earlier.
    return next((x < y for x, y in zip(a, b, strict=False) if x != y), False)


def verdict(ours: dict, theirs: dict, has_hook: bool) -> str:
    if ours["outcome"] == "passed":
        return "PASS"
    if ours["outcome"] == "skipped":
        return "SKIP"
    if theirs["outcome"] in ("passed", "skipped"):
        return "FAIL-OURS"
    if not has_hook:
        return "FAIL-BOTH"
    return "FAIL-OURS" if _stopped_earlier(ours, theirs) else "FAIL-SHARED"


def _short(test_id: str) -> str:
    file, _, name = test_id.partition("::")
    stem = Path(file).stem
    m = re.fullmatch(r"test_plugin_(\w+)_contracts", stem)
    return f"contracts/{m.group(1)}::{name}" if m else f"{stem}::{name}"


def _outcome_label(rec: dict) -> str:
    return {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip"}.get(rec["outcome"], "?")


def cmd_matrix(ns) -> int:
    pristine, ported, work = Path(ns.pristine).resolve(), Path(ns.ported).resolve(), Path(ns.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    timeout = int(os.environ.get("VERIFY_PYTEST_TIMEOUT", "600"))
    problems: list[str] = []

    for rel in UPSTREAM_TESTS:
        a, b = pristine / rel, ported / rel
        same = (tree_digest(a) == tree_digest(b)) if a.is_dir() else (a.read_bytes() == b.read_bytes())
        if not same:
            problems.append(f"port.py changed upstream's {rel}: the ported tree's tests are not upstream's")

    main_hooks = [h for h in HOOKS if not h.extra_env]
    ours_env = {h.env_key: h.ours for h in main_hooks}
    theirs_env = {h.env_key: h.theirs for h in main_hooks}
    say("contract hooks (SLIME_CONTRACT_*), ours / upstream's own:\n" + "\n".join(
        f"  {h.env_key}{''.join(f' +{k}={v}' for k, v in h.extra_env)}: {h.ours} / {h.theirs_label}" for h in HOOKS))
    say("  unset on both trees (no hook of ours; those tests use upstream's reference hooks): "
        + ", ".join(OTHER_CONTRACT_KEYS))

    say("running upstream's CPU tests: ported tree with our hooks ...")
    ours = _run_recorded(ported, work / "ours.json", work / "ours.log", ours_env, UPSTREAM_TESTS, timeout)
    say("running upstream's CPU tests: pristine tree with upstream's own counterpart hooks ...")
    theirs = _run_recorded(pristine, work / "theirs.json", work / "theirs.log", theirs_env, UPSTREAM_TESTS, timeout)
    extra_runs = []
    for i, h in enumerate(h for h in HOOKS if h.extra_env):
        say(f"running {_short(h.test_id)}{h.suffix} on both trees ...")
        o = _run_recorded(ported, work / f"ours{i}.json", work / f"ours{i}.log",
                          {h.env_key: h.ours, **dict(h.extra_env)}, [h.test_id], timeout)
        t = _run_recorded(pristine, work / f"theirs{i}.json", work / f"theirs{i}.log",
                          {h.env_key: h.theirs, **dict(h.extra_env)}, [h.test_id], timeout)
        extra_runs.append((h, o, t))

    for data, where in ((ours, "ported"), (theirs, "pristine")):
        for nodeid, err in data.get("collect_errors", {}).items():
            say(f"  collection error on {where}/: {nodeid or '(session)'}: {err}")
        if data.get("fatal"):
            problems.append(f"the {where} run did not complete: {data['fatal']}")

    hook_of = {h.test_id: h for h in main_hooks}
    ids = list(theirs.get("tests", {}))
    ids += [t for t in ours.get("tests", {}) if t not in ids]
    for h in main_hooks:
        if h.test_id not in ids:
            problems.append(f"contract test {h.test_id} not found upstream (contract files changed?)")

    rows = []  # (test label, hook key, ours rec, theirs rec, verdict, hook)
    # A file that cannot be collected (in either tree) gets a row of its own: its tests are unknown there.
    for nodeid in sorted(set(ours.get("collect_errors", {})) | set(theirs.get("collect_errors", {}))):
        recs = []
        for data in (ours, theirs):
            err = data.get("collect_errors", {}).get(nodeid)
            recs.append({"outcome": "passed"} if err is None else {
                "outcome": "error", "exception": f"collection failed: {err}", "progress": [0],
                "where": f"importing {nodeid or 'the tests'}"})
        name = _short(nodeid + "::").rstrip(":") if nodeid.endswith(".py") else (nodeid or "(session)")
        rows.append((f"{name} (collection)", "-", recs[0], recs[1], verdict(recs[0], recs[1], False), None))
    for tid in ids:
        h = hook_of.get(tid)
        o, t = _result_for(ours, tid), _result_for(theirs, tid)
        rows.append((_short(tid), h.env_key if h else "-", o, t, verdict(o, t, h is not None), h))
    for h, o_data, t_data in extra_runs:
        o, t = _result_for(o_data, h.test_id), _result_for(t_data, h.test_id)
        key = h.env_key + "".join(f"+{k}" for k, _ in h.extra_env)
        rows.append((_short(h.test_id) + h.suffix, key, o, t, verdict(o, t, True), h))

    w_test = max([len("TEST")] + [len(r[0]) for r in rows])
    w_hook = max([len("HOOK")] + [len(r[1]) for r in rows])
    say("")
    say("Upstream CPU tests and plugin contracts. OURS: ported tree, SLIME_CONTRACT_* = this contribution's "
        "hooks. UPSTREAM'S OWN: pristine tree, the same test with upstream's counterpart hook (or no hook).")
    header = f"{'TEST':<{w_test}}  {'HOOK':<{w_hook}}  {'OURS':<5}  {'UPSTREAM_OWN':<12}  VERDICT"
    say(header)
    say("-" * len(header))
    for label, key, o, t, v, _h in rows:
        say(f"{label:<{w_test}}  {key:<{w_hook}}  {_outcome_label(o):<5}  {_outcome_label(t):<12}  {v}")

    say(LEGEND)
    details = [r for r in rows if r[4] != "PASS"]
    if details:
        say("")
        say("Why:")
    for label, key, o, t, v, h in details:
        if h is None:  # a test without a hook: one line for each tree
            say(f"  {v}  {label}")
            for who, rec in (("ported  ", o), ("pristine", t)):
                text = rec["outcome"] if rec["outcome"] in ("passed", "skipped") else (
                    f"{rec.get('exception') or rec.get('error', '?')}  (at {rec.get('where', '?')})")
                say(f"      {who} {text}")
            continue
        say(f"  {v}  {label}  [{key}]")
        for who, name, rec in (("ours          ", h.ours, o), ("upstream's own", h.theirs_label, t)):
            if rec["outcome"] in ("passed", "skipped"):
                say(f"      {who} {name}: {rec['outcome']}")
            else:
                say(f"      {who} {name}: {rec.get('exception') or rec.get('error', '?')}")
                say(f"      {'':14} stopped at {rec.get('where', '?')}")
        if v == "FAIL-SHARED":
            say(f"      expected: {h.expected}")
        elif v == "FAIL-OURS" and t["outcome"] not in ("passed", "skipped"):
            say("      ours stops at an earlier point of the test than upstream's own counterpart")

    counts = {k: sum(1 for r in rows if r[4] == k) for k in ("PASS", "SKIP", "FAIL-SHARED", "FAIL-OURS", "FAIL-BOTH")}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n or k in ("PASS", "FAIL-SHARED", "FAIL-OURS"))
    for p in problems:
        say(f"PROBLEM: {p}")
    failed = counts["FAIL-OURS"] or counts["FAIL-BOTH"] or problems
    say("")
    say(f"contracts: {summary}" + (f"; {len(problems)} problem(s)" if problems else "")
        + (" -> FAILED" if failed else " -> OK"))
    if ns.summary:
        Path(ns.summary).write_text(summary + (f", {len(problems)} problem(s)" if problems else "") + "\n")
    return 1 if failed else 0


# ---------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="contracts.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("deps", help="make this Python able to run upstream's CPU tests")
    s.add_argument("--tree", required=True, help="a pristine upstream tree")
    s.add_argument("--no-install", action="store_true")
    s = sub.add_parser("matrix", help="run upstream's CPU tests on both trees and classify")
    for name in ("--pristine", "--ported", "--work"):  # --work: a folder for logs and results
        s.add_argument(name, required=True)
    s.add_argument("--summary", help="write the one-line counts here")
    s = sub.add_parser("_pytest", help="internal: one recorded pytest session in the current directory")
    s.add_argument("--results", required=True)
    ns = p.parse_args(argv)
    if ns.cmd == "_pytest":
        return run_session(Path(ns.results), pytest_args)
    if ns.cmd == "deps":
        return ensure_deps(Path(ns.tree), ns.no_install or os.environ.get("VERIFY_NO_INSTALL") == "1")
    return cmd_matrix(ns)


if __name__ == "__main__":
    sys.exit(main())