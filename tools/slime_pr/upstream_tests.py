"""Upstream slime's own CPU tests, run inside a tree: the Python that runs them, and one recorded session.

``ensure_deps`` (verify.sh's ``deps``) makes a Python able to import what the tests import: missing modules, found by
running the tests on the pristine tree (some import inside the functions they test), are pip-installed when the
tree's requirements.txt or ``ALSO_INSTALLABLE`` names them; never ray, sglang, sglang_router (upstream's contract
tests stub them) or torch (the user's choice of build). ``run_session`` (contracts.py's ``_pytest``) runs pytest in a
tree and writes each test's outcome as JSON, for a failure with the exception and how far into the test file it got
(its lines on the traceback), so contracts.py can tell whether our hook stopped earlier than upstream's own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

try:
    from .trees import say, tail, tree_env
except ImportError:  # run as a script from this folder
    from trees import say, tail, tree_env

# Upstream's CPU tests this harness runs (relative to a tree). test_megatron_argument_validation.py runs
# upstream's slime_validate_args, which the PR edits, on hand-built args without the --tcod-* flags.
UPSTREAM_TESTS = ["tests/test_sample.py", "tests/test_rollout_metrics.py", "tests/test_megatron_argument_validation.py",
                  "tests/plugin_contracts"]

# Modules never installed by this harness (GPU stack or stubbed by upstream's tests), and pip names of import names
# that differ.
NEVER_INSTALL = {"ray", "sglang", "sglang_router", "torch", "megatron", "transformer_engine", "flash_attn", "apex",
                 "vllm", "deep_ep", "deep_gemm", "triton", "slime", "examples", "tests", "plugin_contracts"}
PIP_NAME = {"yaml": "pyyaml", "PIL": "pillow", "google": "protobuf", "git": "gitpython", "sentry_sdk": "sentry-sdk",
            "dateutil": "python-dateutil", "attr": "attrs", "sklearn": "scikit-learn", "cv2": "opencv-python-headless"}
# Installed when missing besides what the tree's requirements.txt lists (upstream's code imports them; sglang
# brings them in there).
ALSO_INSTALLABLE = {"pytest", "numpy", "pybase64", "pyyaml", "tqdm", "httpx", "aiohttp", "pillow"}
# Modules imported by the counterpart hooks (loaded only while a test runs, so collection misses them).
COUNTERPART_MODULES = ["examples.geo3k_vlm_multi_turn.rollout", "slime.rollout.on_policy_distillation",
                       "slime.rollout.sglang_rollout"]
_MISSING_RE = re.compile(r"No module named '([^']+)'")

_PROBE = """
import importlib, sys
sys.path[:0] = ["tests", "."]
from plugin_contracts._shared import install_stubs
install_stubs(with_sglang_router=True, with_transformers=True)
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as err:
        print(f"probe {name}: {type(err).__name__}: {err}")
"""


def _probe_missing(tree: Path) -> tuple[set[str], str]:
    """Import names that upstream's CPU tests (and the counterpart hooks) cannot find on this Python.

    The tests are run, not only collected: some modules are imported inside the functions they test."""
    pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=line", "-rfE", "--continue-on-collection-errors"]
    missing, text = set(), ""
    for cmd in ([*pytest, *UPSTREAM_TESTS], ["-c", _PROBE, *COUNTERPART_MODULES]):
        proc = subprocess.run([sys.executable, *cmd], cwd=tree, env=tree_env(tree), capture_output=True, text=True,
                              timeout=600)
        out = proc.stdout + proc.stderr
        text += out
        missing |= {m.split(".")[0] for m in _MISSING_RE.findall(out)}
    return missing, text


def _norm(pip_name: str) -> str:
    return re.sub(r"[-_.]+", "-", pip_name).lower()


def _installable(tree: Path) -> set[str]:
    """Pip names this harness may install: the tree's requirements.txt (less what it never installs) and a few."""
    names = set(ALSO_INSTALLABLE)
    req = tree / "requirements.txt"
    if req.is_file():
        for line in req.read_text().splitlines():
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#")[0])
            if m:
                names.add(m.group(1))
    return {_norm(n) for n in names} - {_norm(n) for n in NEVER_INSTALL} - {"sglang-router"}


def has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def ensure_deps(tree: Path, no_install: bool) -> int:
    """0 when upstream's CPU tests can import what they need here (installing it if allowed), else 1."""
    tree = tree.resolve()
    installed: list[str] = []

    def install(pkgs: list[str]) -> bool:
        if no_install:
            say(f"[deps] missing, not installing (VERIFY_NO_INSTALL=1): {' '.join(pkgs)}")
            return False
        if not has_module("pip"):
            say(f"[deps] ERROR: {sys.executable} has no pip; install these yourself: {' '.join(pkgs)}")
            return False
        say(f"[deps] installing into {sys.executable} (missing, needed by upstream's CPU tests): {' '.join(pkgs)}")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               *pkgs], capture_output=True, text=True)
        noise = ("WARNING: Location", "ignored: it is neither")
        for line in (proc.stdout + proc.stderr).splitlines():
            if line.strip() and not any(n in line for n in noise):
                say(f"[deps]   pip: {line}")
        if proc.returncode != 0:
            say(f"[deps] ERROR: pip install {' '.join(pkgs)} failed (exit {proc.returncode})")
            return False
        installed.extend(pkgs)
        return True

    if not has_module("pytest") and not install(["pytest"]):
        return 1
    allowed = _installable(tree)
    refused: list[str] = []
    for _round in range(10):
        missing, text = _probe_missing(tree)
        wanted = sorted(PIP_NAME.get(m, m) for m in missing if _norm(PIP_NAME.get(m, m)) in allowed)
        refused = sorted(m for m in missing if _norm(PIP_NAME.get(m, m)) not in allowed)
        if not wanted:
            break
        if not install(wanted):
            return 1
    else:
        say("[deps] ERROR: still missing modules after 10 install rounds:")
        say(tail(text, 40))
        return 1
    if refused:
        say(f"[deps] ERROR: upstream's CPU tests cannot import {', '.join(refused)} with {sys.executable}. "
            "This harness installs only packages named in the tree's requirements.txt (never ray, sglang, "
            "sglang_router, torch) and a few it knows; install what is missing yourself or use another "
            "PYTHON. The tests that need it fail on both trees. Output of the pristine run:")
        say(tail(text, 30))
        return 1
    say(f"[deps] installed into {sys.executable}: {' '.join(installed)}" if installed else
        f"[deps] upstream's CPU tests import fine with {sys.executable} (nothing installed)")
    return 0


# -------------------------------------------------------------------------------- one recorded session
_STAGE_RANK = {"collect": 0, "setup": 1, "call": 2, "teardown": 3}


def _first_line(text: str, limit: int = 240) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _Recorder:
    """pytest plugin: each test's outcome, and for a failure the exception and the path through the test file."""

    def __init__(self):
        self.tests: dict[str, dict] = {}
        self.collect_errors: dict[str, str] = {}

    def pytest_collectreport(self, report):
        if report.failed:
            text = report.longreprtext
            errs = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
            self.collect_errors[report.nodeid] = errs[-1] if errs else _first_line(text)

    def pytest_runtest_logreport(self, report):
        rec = self.tests.setdefault(report.nodeid, {"outcome": "passed"})
        if report.failed and rec["outcome"] in ("passed", "skipped"):
            rec["outcome"] = "failed" if report.when == "call" else "error"
            rec["stage"] = report.when
            rec.setdefault("error", _first_line(report.longreprtext))
        elif report.skipped and rec["outcome"] == "passed":
            rec["outcome"] = "skipped"
            rec["error"] = _first_line(str(report.longrepr))

    def pytest_exception_interact(self, node, call, report):
        excinfo = call.excinfo
        nodeid = getattr(node, "nodeid", None)
        if excinfo is None or nodeid is None or not hasattr(node, "runtest"):
            return
        rec = self.tests.setdefault(nodeid, {"outcome": "passed"})
        if "exception" in rec:
            return
        test_file = str(node.path)
        path, stmt = [_STAGE_RANK.get(call.when, 2)], ""
        for entry in excinfo.traceback:
            if str(entry.path) == test_file:
                path.append(entry.lineno + 1)
                try:
                    stmt = str(entry.statement).strip().splitlines()[0]
                except Exception:  # noqa: BLE001 - source may be unavailable
                    stmt = ""
        rec["exception"] = f"{excinfo.typename}: {_first_line(excinfo.value)}"
        rec["progress"] = path
        rec["where"] = f"line {path[-1]}: {stmt}" if len(path) > 1 else call.when


def run_session(results: Path, pytest_args: list[str]) -> int:
    """Run pytest in the current directory (a tree) and write the record to ``results``."""
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    tree = Path.cwd().resolve()
    result: dict = {"tree": str(tree), "tests": {}, "collect_errors": {}}

    import importlib.util

    spec = importlib.util.find_spec("slime")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or tree not in origin.parents:
        result["fatal"] = f"'import slime' resolves to {origin}, not to the tree {tree}"
        Path(results).write_text(json.dumps(result, indent=1))
        print(f"ERROR: {result['fatal']}", file=sys.stderr)
        return 3
    import pytest

    rec = _Recorder()
    rc = pytest.main(pytest_args, plugins=[rec])
    result.update(rc=int(rc), tests=rec.tests, collect_errors=rec.collect_errors, slime=str(origin))
    Path(results).write_text(json.dumps(result, indent=1))
    return 0

