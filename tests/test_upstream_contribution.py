"""The PR's files import only what upstream slime has, form no import cycle, and port.py applies them to
an upstream-shaped tree once, idempotently, refusing anything else without changing it.

The full proof against a real upstream checkout is opt-in: set SLIME_UPSTREAM_DIR to a THUDM/slime
checkout and ``test_verify_against_an_upstream_checkout`` runs ``tools/slime_pr/verify.sh`` on it.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from tools.slime_pr import manifest, port, pr_test_entry

ROOT = Path(__file__).resolve().parents[1]

# What upstream slime (624b824) offers that the PR's files import; anything else from slime must be the PR's.
UPSTREAM_API = {
    "slime.utils.types": {"Sample"},
    "slime.utils.http_utils": {"post"},
    "slime.utils.misc": {"load_function"},
    "slime.rollout.sglang_rollout": {"generate_rollout"},
    "slime.utils.arguments": {"add_tcod_arguments", "validate_tcod_args"},  # spliced in by port.py
    "slime.utils.external_utils.command_utils": set(),  # the GPU test's `import ... as U`
}


def _module(rel: str) -> str:
    name = rel[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


PR_MODULES = {_module(rel) for rel in manifest.COPIED_FILES if rel.endswith(".py")}


def _imports(rel: str):
    """(line, module, names) of every import in ``rel``, relative ones resolved."""
    package = _module(rel) if rel.endswith("__init__.py") else _module(rel).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse((ROOT / rel).read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}" if module else base
            yield node.lineno, module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


@pytest.mark.parametrize("rel", [r for r in manifest.COPIED_FILES if r.endswith(".py")])
def test_pr_files_import_only_upstream_api_and_no_private_names(rel):
    for line, module, names in _imports(rel):
        if not module.startswith(("slime", "examples")):
            continue
        if module in PR_MODULES:
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{rel}:{line} imports private {private} from {module}"
            continue
        pr_submodules = {n for n in names if f"{module}.{n}" in PR_MODULES}
        allowed = UPSTREAM_API.get(module)
        assert allowed is not None, f"{rel}:{line} imports {module}, which upstream slime does not have"
        assert set(names) - pr_submodules <= allowed, f"{rel}:{line} imports {names} from {module}"


def test_pr_modules_form_no_import_cycle():
    graph = {m: set() for m in PR_MODULES}
    for rel in manifest.COPIED_FILES:
        if rel.endswith(".py"):
            for _, module, names in _imports(rel):
                targets = {module} | {f"{module}.{n}" for n in names}
                graph[_module(rel)] |= {t for t in targets if t in PR_MODULES and t != _module(rel)}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph[node]:
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(path + [nxt])}"
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_pr_stays_within_its_budget():
    added = sum(len((ROOT / rel).read_text().splitlines()) for rel in manifest.COPIED_FILES)
    spliced = len(port._spliced_source().splitlines())
    assert added + spliced + 20 <= 2500  # 20: index lines, the CI entries, the rendered workflow
    core = sum(len((ROOT / rel).read_text().splitlines()) for rel in manifest.CORE_FILES) + spliced + 3
    assert core <= 400


# ---------------------------------------------------------------------------- port.py on a fake tree
GENERATOR = "from pathlib import Path\nd = Path(__file__).parent\n(d / 'pr-test.yml').write_text((d / 'pr-test.yml.j2').read_text())\n"


def _fake_upstream(root: Path) -> Path:
    """The smallest tree carrying every marker port.py checks (not upstream's code)."""
    for rel, needle, _ in port.EXPECTED:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((path.read_text() if path.exists() else "") + needle + "\n")
    (root / "slime/utils/arguments.py").write_text(
        "import os\n\n\n"
        "def get_slime_extra_args_provider(add_custom_arguments=None):\n"
        "    def add_slime_arguments(parser):\n"
        "        parser = add_on_policy_distillation_arguments(parser)\n"
        "        return parser\n\n"
        "    return add_slime_arguments\n\n\n"
        "def slime_validate_args(args):\n"
        "    if args.custom_config_path:\n"
        "        args.x = 1\n\n"
        "    if args.y:\n"
        "        raise ValueError('y')\n"
    )
    (root / pr_test_entry.GENERATOR).write_text(GENERATOR)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_port_applies_once_and_is_idempotent(tmp_path):
    tree = _fake_upstream(tmp_path / "slime_checkout")
    port.port(tree, commit=False)
    for rel in manifest.COPIED_FILES:
        assert (tree / rel).read_bytes() == (ROOT / rel).read_bytes()
    assert not (tree / "scripts/run-tiny-tcod.sh").exists() and not (tree / "tools").exists()  # runtime only
    arguments = (tree / "slime/utils/arguments.py").read_text()
    ast.parse(arguments)
    lines = arguments.splitlines()
    assert lines[lines.index(port.REGISTER_LINE.rstrip("\n")) - 1].endswith("add_on_policy_distillation_arguments(parser)")
    validate = lines.index(port.VALIDATE_LINE.rstrip("\n"))
    assert lines[validate - 2].strip() == "args.x = 1" and "if args.y:" in lines[validate + 2]  # after the YAML
    assert pr_test_entry.ENTRY in (tree / pr_test_entry.RENDERED).read_text()
    before = _snapshot(tree)
    assert port.port(tree) == []
    assert _snapshot(tree) == before


def test_port_commits_a_short_series_in_a_git_tree(tmp_path):
    tree = _fake_upstream(tmp_path / "repo")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "upstream"], check=True)
    port.port(tree)
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert log[:-1] == [message for message, _ in reversed(port.COMMITS)]
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == ""
    assert port.port(tree) == []


def test_port_refuses_other_trees_and_changes_nothing(tmp_path):
    tree = _fake_upstream(tmp_path / "old_slime")
    (tree / "slime/utils/http_utils.py").write_text("async def post(url, payload):\n    pass\n")
    before = _snapshot(tree)
    with pytest.raises(port.PortError, match="http_utils.post"):
        port.port(tree)
    assert _snapshot(tree) == before
    with pytest.raises(port.PortError, match="this repository itself"):
        port.port(ROOT)
    assert port.main([str(tmp_path / "missing")]) == 2


@pytest.mark.skipif(
    not os.environ.get("SLIME_UPSTREAM_DIR"), reason="opt-in: set SLIME_UPSTREAM_DIR to a THUDM/slime checkout"
)
def test_verify_against_an_upstream_checkout():
    out = subprocess.run(
        ["bash", "tools/slime_pr/verify.sh", os.environ["SLIME_UPSTREAM_DIR"]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
