"""Make a Python able to run upstream slime's CPU tests (the ``deps`` step of ``verify.sh``).

The missing modules are found by running the tests on the pristine tree (some are imported only inside
the functions they test), then installed with pip when the tree's requirements.txt or
``ALSO_INSTALLABLE`` names them. ray, sglang, sglang_router and torch are never installed: upstream's
contract tests stub the first three, torch is the user's choice of build.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

try:
    from .verify_trees import UPSTREAM_TESTS, say, tail, tree_env
except ImportError:  # run as a script from this folder
    from verify_trees import UPSTREAM_TESTS, say, tail, tree_env

# Modules never installed by this harness (GPU stack or stubbed by upstream's tests), and pip names of
# import names that differ.
NEVER_INSTALL = {"ray", "sglang", "sglang_router", "torch", "megatron", "transformer_engine", "flash_attn",
                 "apex", "vllm", "deep_ep", "deep_gemm", "triton", "slime", "examples", "tests",
                 "plugin_contracts"}
PIP_NAME = {"yaml": "pyyaml", "PIL": "pillow", "google": "protobuf", "git": "gitpython",
            "sentry_sdk": "sentry-sdk", "dateutil": "python-dateutil", "attr": "attrs",
            "sklearn": "scikit-learn", "cv2": "opencv-python-headless"}

# Installed when missing besides what the tree's requirements.txt lists (imported by upstream's code, but
# brought in there by sglang).
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
    env = tree_env(tree)
    runs = [
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=line", "-rfE",
         "--continue-on-collection-errors", *UPSTREAM_TESTS],
        [sys.executable, "-c", _PROBE, *COUNTERPART_MODULES],
    ]
    missing, text = set(), ""
    for cmd in runs:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
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
    if installed:
        say(f"[deps] installed into {sys.executable}: {' '.join(installed)}")
    else:
        say(f"[deps] upstream's CPU tests import fine with {sys.executable} (nothing installed)")
    return 0


