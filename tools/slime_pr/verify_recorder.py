"""One recorded pytest session inside a tree (the internal ``_pytest`` step of ``contracts.py``).

Each test's outcome is written as JSON, and for a failure the exception and how far into the test file
it got (the line numbers of the test file on the traceback), so ``contracts.py`` can tell whether our
hook stopped earlier in a contract test than upstream's own counterpart did.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

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

    def third_party_modules(self, tree: Path) -> dict[str, str]:
        """Third-party modules that the tree's own loaded modules import directly: name -> 'dist version'.

        Read from the import statements of every module of the tree that the session loaded, kept if the
        module was actually imported; upstream's stubs (ray, sglang_router, transformers) show as 'stub'.
        """
        import ast

        try:
            from importlib.metadata import packages_distributions, version

            dists = packages_distributions()
        except Exception:  # noqa: BLE001
            dists, version = {}, None
        names: set[str] = set()
        for mod in list(sys.modules.values()):
            file = getattr(mod, "__file__", None)
            if not file or not file.endswith(".py") or tree not in Path(file).resolve().parents:
                continue
            try:
                parsed = ast.parse(Path(file).read_text(errors="replace"))
            except (OSError, SyntaxError):
                continue
            for node in ast.walk(parsed):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
        own = {"slime", "examples", "tests", "plugin_contracts", "slime_plugins"}
        out = {}
        for name in sorted(names):
            if name in own or name in sys.stdlib_module_names or name.startswith("_") or name not in sys.modules:
                continue
            mod = sys.modules[name]
            if getattr(mod, "__file__", None) is None and not hasattr(mod, "__path__"):
                out[name] = "stub"
                continue
            dist = (dists.get(name) or [None])[0]
            try:
                out[name] = f"{dist} {version(dist)}" if dist and version else "?"
            except Exception:  # noqa: BLE001
                out[name] = dist or "?"
        return out



def run_session(results: Path, pytest_args: list[str]) -> int:
    """Run pytest in the current directory (a tree) and write the record to ``results``."""
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    tree = Path.cwd().resolve()
    result: dict = {"tree": str(tree), "tests": {}, "collect_errors": {}, "modules": {}}

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
    result.update(rc=int(rc), tests=rec.tests, collect_errors=rec.collect_errors,
                  modules=rec.third_party_modules(tree), slime=str(origin))
    Path(results).write_text(json.dumps(result, indent=1))
    return 0

