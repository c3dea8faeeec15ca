"""The slime contribution stays portable: it imports only what upstream slime has, and port.py edits an
upstream-shaped tree once, idempotently, and refuses anything else.

The full proof against a real upstream checkout is opt-in (it needs one): set SLIME_UPSTREAM_DIR to a
THUDM/slime checkout and ``test_verify_against_an_upstream_checkout`` runs
``tools/slime_pr/verify.sh`` on it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.slime_pr import port

ROOT = Path(__file__).resolve().parents[1]

# What upstream slime (THUDM/slime @624b824) offers that the contribution may import. Anything else
# from ``slime.`` must be a contribution module itself.
UPSTREAM_API = {
    "slime.utils.types": {"Sample"},
    "slime.utils.http_utils": {"post"},
    "slime.utils.misc": {"load_function"},
    "slime.utils": {"http_utils"},
    "slime.rollout.sglang_rollout": {"generate_rollout"},
}


# Optional imports of this project's runtime, made inside a function behind a clear error.
RUNTIME_EXTRAS = {("slime/rollout/expert_sft.py", "slime.utils.tiny_models")}
# The port's own tooling runs against upstream's tree (smoke.py imports upstream-only modules on purpose).
TOOLING = "tools/slime_pr/"


def _contribution_modules() -> set[str]:
    names = set()
    for rel in port.contribution_files():
        if rel.endswith(".py"):
            name = rel[:-3].replace("/", ".")
            names.add(name[: -len(".__init__")] if name.endswith(".__init__") else name)
    return names


def _python_files():
    return [rel for rel in port.contribution_files() if rel.endswith(".py") and not rel.startswith(TOOLING)]


@pytest.mark.parametrize("rel", _python_files())
def test_contribution_imports_only_upstream_api(rel):
    own = _contribution_modules()
    tree = ast.parse((ROOT / rel).read_text())
    package = rel[:-3].replace("/", ".").rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative import inside the example package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}" if module else base
            if not module.startswith(("slime", "examples")):
                continue
            if module in own or any(f"{module}.{a.name}" in own for a in node.names):
                continue
            if (rel, module) in RUNTIME_EXTRAS:
                continue
            allowed = UPSTREAM_API.get(module, set())
            names = {a.name for a in node.names}
            assert names <= allowed, f"{rel}:{node.lineno} imports {sorted(names - allowed)} from {module}, " \
                                     "which upstream slime does not offer"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("slime.") or alias.name in own, \
                    f"{rel}:{node.lineno} imports {alias.name}"


@pytest.mark.parametrize("rel", _python_files())
def test_contribution_uses_no_runtime_only_names(rel):
    # Upstream has only the nested Sample.Status, no prompt_length/validate, and no timeout keyword.
    source = (ROOT / rel).read_text()
    for needle in (".prompt_length", ".validate()", "HTTPRequestError", "timeout=", "rollout_engine_urls["):
        if needle == "rollout_engine_urls[" and rel.endswith("multi_turn.py"):
            continue  # read with getattr as a fallback when no router is configured
        if needle == "timeout=" and rel.startswith("examples/"):
            continue  # environment adapters time their own subprocesses
        assert needle not in source, f"{rel} uses {needle!r}, which upstream slime does not have"


# ---------------------------------------------------------------------------- port.py on a fake tree
def _fake_upstream(root: Path) -> Path:
    """The smallest tree carrying every marker port.py checks (not upstream's code)."""
    for rel, needle, _ in port.EXPECTED:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text() if path.exists() else ""
        path.write_text(text + needle + "\n")
    (root / "slime/utils/arguments.py").write_text(
        "import os\n\n\n"
        "def get_slime_extra_args_provider(add_custom_arguments=None):\n"
        "    def add_slime_arguments(parser):\n"
        "        parser = add_on_policy_distillation_arguments(parser)\n"
        "        return parser\n"
        "    return add_slime_arguments\n\n\n"
        "def slime_validate_args(args):\n"
        "    if args.x:\n"
        "        raise ValueError('x')\n")
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_port_edits_once_and_is_idempotent(tmp_path):
    tree = _fake_upstream(tmp_path / "slime_checkout")
    changes = port.port(tree)
    assert any("replace slime/rollout/on_policy_distillation.py" not in c for c in changes)
    assert sum(c.startswith("edit") for c in changes) == 3
    for rel in port.CONTRIBUTION_FILES:
        assert (tree / rel).read_bytes() == (ROOT / rel).read_bytes()
    assert not (tree / "scripts/run-tiny-tcod.sh").exists()  # runtime-only
    arguments = (tree / "slime/utils/arguments.py").read_text()
    ast.parse(arguments)
    lines = arguments.splitlines()
    assert lines[0] == "import os" and lines[1].startswith(port.IMPORT_LINE)
    register = lines.index(port.REGISTER_LINE.rstrip("\n"))
    assert "add_on_policy_distillation_arguments" in lines[register - 1]
    assert lines[-1] == port.VALIDATE_LINE.rstrip("\n")  # after the last statement, at function level
    before = _snapshot(tree)
    assert port.port(tree) == []
    assert _snapshot(tree) == before


def test_port_refuses_other_trees_and_changes_nothing(tmp_path):
    tree = _fake_upstream(tmp_path / "old_slime")
    (tree / "slime/utils/http_utils.py").write_text("async def post(url, payload):\n    pass\n")
    before = _snapshot(tree)
    with pytest.raises(port.PortError, match="http_utils.post"):
        port.port(tree)
    assert _snapshot(tree) == before
    with pytest.raises(port.PortError, match="this project itself"):
        port.port(ROOT)
    assert port.main([str(tmp_path / "missing")]) == 2


def test_port_refuses_a_validate_function_with_early_returns(tmp_path):
    tree = _fake_upstream(tmp_path / "slime_checkout")
    path = tree / "slime/utils/arguments.py"
    path.write_text(path.read_text() + "    return args\n")
    with pytest.raises(port.PortError, match="return statement"):
        port.port(tree)


@pytest.mark.skipif(not os.environ.get("SLIME_UPSTREAM_DIR"), reason="opt-in: set SLIME_UPSTREAM_DIR to a "
                    "THUDM/slime checkout to run the port, upstream's CPU tests and the TCOD smoke run on it")
def test_verify_against_an_upstream_checkout():
    out = subprocess.run(["bash", "tools/slime_pr/verify.sh", os.environ["SLIME_UPSTREAM_DIR"]],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_verify_script_refuses_a_missing_checkout(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    out = subprocess.run(["bash", "tools/slime_pr/verify.sh", str(tmp_path / "nope")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
