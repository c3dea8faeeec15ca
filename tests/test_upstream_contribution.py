"""The PR's files import only what upstream slime has, form no import cycle, stay within the caps, and
port.py applies them to an upstream-shaped tree once, idempotently, in upstream's conventions (the --tcod-*
group nested in get_slime_extra_args_provider, its validation inline in slime_validate_args), refusing
anything else without changing it; verify_pr.py's caps and runtime-name checks report what they find.

The full proof against a real upstream checkout is opt-in: set SLIME_UPSTREAM_DIR to a THUDM/slime
checkout and ``test_verify_against_an_upstream_checkout`` runs ``tools/slime_pr/verify.sh`` on it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.slime_pr import manifest, port, verify_pr
from slime.utils.tcod_arguments import validate_tcod_args

ROOT = Path(__file__).resolve().parents[1]

# What upstream slime (624b824) offers that the PR's files import; anything else from slime must be the PR's.
UPSTREAM_API = {
    "slime.utils.types": {"Sample"},
    "slime.utils.http_utils": {"post"},
    "slime.utils.misc": {"load_function"},
    "slime.rollout": {"sample_hooks"},
    "slime.rollout.sglang_rollout": {"generate_rollout", "GenerateState"},
    "slime.rollout.sample_hooks": {"set_current_rollout_id", "get_current_rollout_id"},  # the getter: port.py's
    "slime.utils.external_utils.command_utils": set(),  # the GPU test's `import ... as U`
    # geo3k's env loader, reused rather than copied (issue 58); this runtime's stand-in has the same name
    "examples.geo3k_vlm_multi_turn.rollout": {"_load_env_module"},
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


# A git directory of slime holding manifest.VERIFIED_COMMIT (a clone of github.com/THUDM/slime); the checks
# that read slime's own files skip without it.
UPSTREAM_GIT = Path(os.environ.get("SLIME_UPSTREAM_GIT") or "/nonexistent/slime.git")


def _upstream_public_names(module: str) -> set[str] | None:
    """Public top-level names (and subpackages) of ``module`` in upstream at VERIFIED_COMMIT; None if absent."""
    if not UPSTREAM_GIT.is_dir():
        return None
    base = module.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        cmd = ["git", "-C", str(UPSTREAM_GIT), "show", f"{manifest.VERIFIED_COMMIT}:{rel}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            continue
        names = set()
        for node in ast.parse(out.stdout).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if rel.endswith("__init__.py"):
            tree = ["git", "-C", str(UPSTREAM_GIT), "ls-tree", "--name-only", f"{manifest.VERIFIED_COMMIT}:{base}"]
            listing = subprocess.run(tree, capture_output=True, text=True).stdout.split()
            names |= {n.removesuffix(".py") for n in listing if n != "__init__.py"}
        return {n for n in names if not n.startswith("_")}
    return set()


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
        if rel in manifest.TEST_FILES and not set(names) - pr_submodules <= (allowed or set()):
            # A test may drive any public piece of upstream, as upstream's own tests do (checked against
            # upstream's tree at VERIFIED_COMMIT); the PR's code keeps to UPSTREAM_API.
            upstream = _upstream_public_names(module)
            if upstream is None:
                pytest.skip("no upstream slime git directory (SLIME_UPSTREAM_GIT) to check a test's imports")
            assert upstream, f"{rel}:{line} imports {module}, which upstream slime does not have"
            allowed = (allowed or set()) | upstream
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


def _lines(rel: str) -> int:
    return len((ROOT / rel).read_text().splitlines())


def test_pr_stays_within_its_caps():
    group, validate = manifest.spliced_text()
    spliced = len(group) + len(validate) + 2 + len(manifest.REGISTER_LINE.splitlines())  # +2: blank lines
    core = sum(_lines(rel) for rel in manifest.CORE_FILES) + spliced + len(manifest.GETTER.splitlines())
    assert core <= manifest.CAPS["core"]
    example_py = sum(_lines(rel) for rel in manifest.EXAMPLE_FILES if rel.endswith(".py"))
    assert example_py <= manifest.CAPS["example_py"]
    # core counts the CORE_FILES, which COPIED_FILES holds too. Registration: the template's entries, each
    # rendered in pr-test.yml as a JSON object of 4 or 5 lines, the GPU ones in two jobs; 10: indexes, README.
    registered = len(manifest.ENTRIES) + 2 * 5 * len(manifest.GPU_ENTRIES) + 4 * len(manifest.CPU_ENTRIES)
    copied = sum(_lines(rel) for rel in manifest.COPIED_FILES if rel not in manifest.CORE_FILES)
    assert copied + core + registered + 10 <= manifest.CAPS["added"]


def test_runtime_has_the_upstream_names_the_pr_uses():
    from slime.rollout import sample_hooks

    sample_hooks.set_current_rollout_id(7)
    assert sample_hooks.get_current_rollout_id() == 7  # the same getter port.py adds upstream
    sample_hooks.set_current_rollout_id(None)
    assert "def get_current_rollout_id() -> int | None:" in manifest.GETTER


def test_validation_leaves_args_without_tcod_flags_alone():
    # Upstream's tests (test_megatron_argument_validation.py) validate hand-built args that lack the TCOD flags.
    args = SimpleNamespace()
    validate_tcod_args(args)
    assert vars(args) == {}


# ---------------------------------------------------------------------------- port.py on a fake tree
GENERATOR = "from pathlib import Path\nd = Path(__file__).parent\n(d / 'pr-test.yml').write_text((d / 'pr-test.yml.j2').read_text())\n"


# Upstream's CI template in miniature: the GPU list with the OPD test, a CPU job's list.
FAKE_TEMPLATE = f"""<% set megatron_tests = [
    {manifest.ANCHOR}
    {{'test_file': 'test_other_gpu.py', 'num_gpus': 4}},
] %>
<% set jobs = {{
    {manifest.CPU_JOB_LINE}
      'cpu': True,
      'tests': [
        {{'test_file': 'test_sample.py', 'num_gpus': 0}},
      ],
    }},
}} %>
"""


# Upstream's layout in miniature: groups nested in the provider, validation blocks in slime_validate_args.
FAKE_ARGUMENTS = """import os


def get_slime_extra_args_provider(add_custom_arguments=None):
    def add_slime_arguments(parser):
        def add_on_policy_distillation_arguments(parser):
            parser.add_argument("--use-opd", action="store_true", default=False)
            return parser

        # wandb
        def add_wandb_arguments(parser):
            return parser

        parser = add_on_policy_distillation_arguments(parser)
        parser = add_wandb_arguments(parser)
        return parser

    return add_slime_arguments


def slime_validate_args(args):
    if args.use_opd:
        pass

    if args.custom_config_path:
        args.x = 1

    if args.y:
        raise ValueError("y")
"""


def _fake_upstream(root: Path) -> Path:
    """The smallest tree carrying every marker port.py checks (not upstream's code)."""
    for rel, needle, _ in manifest.EXPECTED:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((path.read_text() if path.exists() else "") + needle + "\n")
    (root / manifest.ARGS).write_text(FAKE_ARGUMENTS)
    (root / manifest.TEMPLATE).write_text(FAKE_TEMPLATE)
    (root / manifest.GENERATOR).write_text(GENERATOR)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _nested(node, name):
    return next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_port_applies_once_and_is_idempotent(tmp_path):
    tree = _fake_upstream(tmp_path / "slime_checkout")
    port.port(tree, commit=False)
    for rel in manifest.COPIED_FILES:
        assert (tree / rel).read_bytes() == (ROOT / rel).read_bytes()
    assert not (tree / "scripts/run-tiny-tcod.sh").exists() and not (tree / "tools").exists()  # runtime only
    assert not (tree / manifest.ARGUMENTS_SOURCE).exists()  # spliced, not copied
    arguments = (tree / manifest.ARGS).read_text()
    module = ast.parse(arguments)
    top = [n.name for n in module.body if isinstance(n, ast.FunctionDef)]
    assert top == ["get_slime_extra_args_provider", "slime_validate_args"]  # nothing at module level
    inner = _nested(_nested(module, "get_slime_extra_args_provider"), "add_slime_arguments")
    defs = [n.name for n in inner.body if isinstance(n, ast.FunctionDef)]
    assert defs == ["add_on_policy_distillation_arguments", "add_tcod_arguments", "add_wandb_arguments"]
    calls = [ast.unparse(n.value) for n in inner.body if isinstance(n, ast.Assign)]
    assert calls == [f"{g}(parser)" for g in defs]  # registered right after the OPD group
    body = _nested(module, "slime_validate_args").body
    tests = [ast.unparse(n.test) for n in body]
    assert tests == ["args.use_opd", "args.custom_config_path", "getattr(args, 'use_tcod', False)", "args.y"]
    assert "validate_tcod_args" not in arguments and "def validate" not in arguments  # inline, not a call
    assert "        def add_tcod_arguments(parser):\n" in arguments and "\n\n\n        def" not in arguments
    hooks = (tree / manifest.SAMPLE_HOOKS).read_text()
    assert hooks.count("def get_current_rollout_id() -> int | None:") == 1
    rendered = (tree / manifest.RENDERED).read_text()
    assert all(rendered.count(entry) == 1 for entry in manifest.ENTRIES)
    lines = [line.strip() for line in rendered.splitlines()]
    opd = lines.index(manifest.ANCHOR)
    assert lines[opd + 1 : opd + 1 + len(manifest.GPU_ENTRIES)] == list(manifest.GPU_ENTRIES)
    sample = lines.index("{'test_file': 'test_sample.py', 'num_gpus': 0},")  # the CPU job's list, at its end
    assert lines[sample + 1 : sample + 2 + len(manifest.CPU_ENTRIES)] == [*manifest.CPU_ENTRIES, "],"]
    before = _snapshot(tree)
    assert port.port(tree) == []
    assert _snapshot(tree) == before


def test_splice_replaces_itself_and_comes_off_cleanly():
    ported = manifest.edit_arguments(FAKE_ARGUMENTS)
    assert manifest.edit_arguments(ported) == ported
    assert manifest.remove_splice(ported) == FAKE_ARGUMENTS
    group, validate = manifest.spliced_text()
    assert "".join(group) in ported and "".join(validate) in ported
    stale = ported.replace("Default is 1.", "Default is one.")  # an older splice is replaced, not doubled
    assert manifest.edit_arguments(stale) == ported


def test_spliced_group_parses_as_the_runtime_does():
    import argparse

    from slime.utils.tcod_arguments import add_tcod_arguments

    namespace: dict = {}
    # The nested def as upstream will hold it, back at module level to run it here.
    text = "".join(line[len(manifest.GROUP_INDENT) :] if line.strip() else line for line in manifest.spliced_text()[0])
    exec(compile(text, "splice", "exec"), namespace)
    ours = namespace["add_tcod_arguments"](argparse.ArgumentParser()).parse_args([])
    runtime = add_tcod_arguments(argparse.ArgumentParser()).parse_args([])
    assert vars(ours) == vars(runtime) == {
        "use_tcod": False, "tcod_mode": None, "tcod_k_start": None, "tcod_eta": None, "tcod_k_max": None}


UPSTREAM_MIRROR = UPSTREAM_GIT


@pytest.mark.skipif(not UPSTREAM_MIRROR.is_dir(), reason="no upstream slime git directory (SLIME_UPSTREAM_GIT)")
def test_pr_stays_within_its_caps_on_upstreams_tree(tmp_path):
    tree = tmp_path / "slime"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(UPSTREAM_MIRROR), "archive", manifest.VERIFIED_COMMIT],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    pristine = tmp_path / "pristine"
    shutil.copytree(tree, pristine)
    port.port(tree, commit=False)
    files = verify_pr.diff_stats(pristine, tree)
    added = sum(len(a) for a, _ in files.values())
    core = sum(len(a) for rel, (a, _) in files.items() if rel.startswith("slime/"))
    assert core <= manifest.CAPS["core"], f"+{core} lines under slime/"
    assert added <= manifest.CAPS["added"], f"the PR adds {added} lines: " + ", ".join(
        f"{rel} +{len(a)}" for rel, (a, _) in sorted(files.items(), key=lambda kv: -len(kv[1][0])))


@pytest.mark.skipif(not UPSTREAM_MIRROR.is_dir(), reason="no upstream slime git directory (SLIME_UPSTREAM_GIT)")
def test_splice_on_upstreams_own_arguments_py():
    def show(rel):
        cmd = ["git", "-C", str(UPSTREAM_MIRROR), "show", f"{manifest.VERIFIED_COMMIT}:{rel}"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    upstream = show(manifest.ARGS)
    ported = manifest.edit_arguments(upstream)
    assert manifest.edit_arguments(ported) == ported and manifest.remove_splice(ported) == upstream
    lines = ported.splitlines()
    opd = lines.index("        def add_on_policy_distillation_arguments(parser):")
    assert lines.index("        def add_tcod_arguments(parser):") > opd
    assert lines.index(manifest.REGISTER_LINE.rstrip("\n")) == lines.index(manifest.REGISTER_ANCHOR.rstrip("\n")) + 1
    yaml_at = next(i for i, line in enumerate(lines) if line == "    if args.custom_config_path:")
    tcod_at = lines.index('    if getattr(args, "use_tcod", False):')
    assert yaml_at < tcod_at < lines.index("    if args.eval_max_context_len is None:")
    hooks = show(manifest.SAMPLE_HOOKS)
    edited = manifest.edit_sample_hooks(hooks)
    assert edited != hooks and manifest.edit_sample_hooks(edited) == edited
    assert len(edited.splitlines()) - len(hooks.splitlines()) == len(manifest.GETTER.splitlines())


def test_port_commits_a_short_series_in_a_git_tree(tmp_path):
    tree = _fake_upstream(tmp_path / "repo")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "upstream"], check=True)
    port.port(tree)
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert log[:-1] == [message for message, _ in reversed(manifest.COMMITS)]
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
        timeout=7200,  # the CPU-CI step runs upstream's CPU jobs on both trees (and may build its venvs)
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
