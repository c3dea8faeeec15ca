"""The upstream proof harness (tools/slime_pr/verify.sh, trees.py, contracts.py, verify_pr.py, cpu_ci.py), without an
upstream checkout: argument handling, refusing trees that are not upstream slime, tree copies and checksums,
the verdict rules, the pytest recorder on a tiny stand-in tree, the PR's caps and runtime-name checks
on stand-in pristine / ported trees, and how the CPU-CI step reads upstream's CPU jobs (pip lines, files,
torch from PyPI when its index is unreachable), layers its venvs and judges a test file's pytest summary."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.slime_pr import contracts, cpu_ci_env, manifest, trees, verify_pr

REPO = Path(__file__).resolve().parents[1]
VERIFY = REPO / "tools/slime_pr/verify.sh"
CONTRACTS = REPO / "tools/slime_pr/contracts.py"

# The files verify.sh looks for before it accepts SLIME_DIR as an upstream slime tree.
MARKERS = ["slime/__init__.py", "slime/utils/arguments.py", "slime/utils/types.py",
           "slime/rollout/sglang_rollout.py", "tests/test_sample.py", "tests/test_rollout_metrics.py",
           "tests/plugin_contracts/_shared.py"]


def _verify(*args, env=None):
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(VERIFY), *args], capture_output=True, text=True, env=full_env, timeout=60)


def _fake_slime_tree(root: Path) -> Path:
    for rel in MARKERS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    return root


def test_verify_needs_exactly_one_argument():
    for args in ([], ["a", "b"]):
        proc = _verify(*args)
        assert proc.returncode == 2 and "usage:" in proc.stderr
    proc = _verify("--help")
    assert proc.returncode == 0 and "usage:" in proc.stderr


@pytest.mark.parametrize("case", ["missing", "file", "project", "not-slime", "ported"])
def test_verify_refuses_a_bad_slime_dir(tmp_path, case):
    if case == "missing":
        target, expected = tmp_path / "nope", "does not exist"
    elif case == "file":
        target, expected = tmp_path / "f", "not a directory"
        target.write_text("")
    elif case == "project":
        target, expected = REPO, "is this project"
    elif case == "not-slime":
        target, expected = tmp_path, "not an upstream slime tree (no slime/__init__.py)"
    else:
        target, expected = _fake_slime_tree(tmp_path), "looks ported already"
        (target / "slime/rollout/tcod.py").write_text("")
    proc = _verify(str(target))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert "== copies" not in proc.stdout  # refused before copying or porting anything


def test_verify_refuses_a_missing_python(tmp_path):
    proc = _verify(str(_fake_slime_tree(tmp_path)), env={"PYTHON": str(tmp_path / "no-python")})
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_copy_tree_of_a_plain_tree_skips_caches_and_virtualenvs(tmp_path):
    src = _fake_slime_tree(tmp_path / "src")
    for junk in [".venv/lib/x.py", "slime/__pycache__/a.pyc", ".git/HEAD", "pkg.egg-info/PKG-INFO"]:
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("junk")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    assert trees.main(["copy", str(src), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    assert all((dst / rel).is_file() for rel in MARKERS)
    assert not any((dst / j).exists() for j in [".venv", "slime/__pycache__", ".git", "pkg.egg-info"])
    assert os.access(dst / "run.sh", os.X_OK)
    assert trees.tree_digest(src) == trees.tree_digest(dst)  # the junk is outside the checksum too


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_copy_tree_of_a_git_checkout_takes_its_files_but_not_ignored_ones(tmp_path):
    src = _fake_slime_tree(tmp_path / "src")
    (src / ".gitignore").write_text("ignored/\n")
    (src / "ignored").mkdir()
    (src / "ignored/big").write_text("x")
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    (src / "untracked.txt").write_text("u")  # untracked, not ignored: part of the working tree
    (src / "slime/utils/types.py").unlink()  # deleted in the working tree: not copied
    assert trees.main(["copy", str(src), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    assert (dst / "untracked.txt").is_file() and (dst / ".gitignore").is_file()
    assert not (dst / "ignored").exists() and not (dst / ".git").exists()
    assert not (dst / "slime/utils/types.py").exists()


def test_tree_digest_sees_content_names_and_modes(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = trees.tree_digest(tmp_path)
    assert trees.tree_digest(tmp_path) == first
    (tmp_path / "a.py").chmod(0o755)
    moded = trees.tree_digest(tmp_path)
    assert moded != first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert trees.tree_digest(tmp_path) != moded
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__/a.pyc").write_bytes(b"\0")
    before = trees.tree_digest(tmp_path)
    (tmp_path / "b.py").write_text("")
    assert trees.tree_digest(tmp_path) != before


def _rec(outcome, progress=None):
    return {"outcome": outcome, "progress": progress or [2, 10]}


def test_verdicts():
    v = contracts.verdict
    assert v(_rec("passed"), _rec("failed"), True) == "PASS"
    assert v(_rec("failed"), _rec("passed"), True) == "FAIL-OURS"
    assert v(_rec("failed"), _rec("passed"), False) == "FAIL-OURS"
    assert v(_rec("failed"), _rec("failed"), False) == "FAIL-BOTH"
    # Both fail with the hook: shared if ours got at least as far through the test as upstream's own.
    assert v(_rec("failed", [2, 165]), _rec("failed", [2, 165]), True) == "FAIL-SHARED"
    assert v(_rec("failed", [2, 170]), _rec("failed", [2, 165]), True) == "FAIL-SHARED"
    assert v(_rec("failed", [2, 164]), _rec("failed", [2, 165]), True) == "FAIL-OURS"
    assert v(_rec("failed", [2, 140, 12]), _rec("failed", [2, 140, 30]), True) == "FAIL-OURS"
    assert v(_rec("error", [0]), _rec("failed", [2, 165]), True) == "FAIL-OURS"  # collection error
    assert v(_rec("error", [1]), _rec("failed", [2, 165]), True) == "FAIL-OURS"  # setup error


def test_hook_table_names_the_contribution_hooks():
    by_key = {h.env_key: h for h in contracts.HOOKS if not h.extra_env}
    # No rollout function of its own: upstream's default generate_rollout calls the agent loop.
    assert {"ROLLOUT_FUNCTION_PATH", "EVAL_FUNCTION_PATH"} <= set(contracts.OTHER_CONTRACT_KEYS) - set(by_key)
    assert by_key["CUSTOM_GENERATE_FUNCTION_PATH"].ours == "examples.multi_turn_tcod.rollout.generate"
    assert by_key["CUSTOM_RM_PATH"].ours == "slime.rollout.on_policy_distillation.reward_func"
    assert by_key["CUSTOM_REWARD_POST_PROCESS_PATH"].ours == "slime.rollout.on_policy_distillation.post_process_rewards"


def test_recorder_on_a_stand_in_tree(tmp_path):
    """The internal pytest runner records outcomes and how far a failing test got into its file."""
    tree = tmp_path / "tree"
    (tree / "slime").mkdir(parents=True)
    (tree / "slime/__init__.py").write_text("")
    (tree / "tests").mkdir()
    (tree / "tests/test_x.py").write_text(
        "import os\n"
        "def helper():\n"
        "    raise ValueError('deep')\n"
        "def test_ok():\n"
        "    assert True\n"
        "def test_early():\n"
        "    raise KeyError('early')\n"
        "def test_late():\n"
        "    x = 1\n"
        "    helper()\n"
        "def test_env():\n"
        "    assert os.environ['SLIME_CONTRACT_X'] == 'y'\n"
    )
    (tree / "tests/test_broken.py").write_text("import no_such_module_here\n")
    results = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_CONTRACT_")}
    env.update(PYTHONPATH=str(tree), SLIME_CONTRACT_X="y")
    subprocess.run([sys.executable, str(CONTRACTS), "_pytest", "--results", str(results), "--",
                    "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors", "tests"],
                   cwd=tree, env=env, capture_output=True, timeout=120, check=True)
    data = json.loads(results.read_text())
    tests = data["tests"]
    assert tests["tests/test_x.py::test_ok"]["outcome"] == "passed"
    assert tests["tests/test_x.py::test_env"]["outcome"] == "passed"
    early, late = tests["tests/test_x.py::test_early"], tests["tests/test_x.py::test_late"]
    assert early["outcome"] == late["outcome"] == "failed"
    assert early["exception"].startswith("KeyError") and late["exception"].startswith("ValueError: deep")
    assert early["progress"] == [2, 7] and late["progress"] == [2, 10, 3]
    assert contracts._stopped_earlier(early, late)
    assert "No module named 'no_such_module_here'" in data["collect_errors"]["tests/test_broken.py"]
    assert data["slime"] == str((tree / "slime/__init__.py").resolve())


# ---------------------------------------------------------------------------- verify_pr.py: caps and names
def _pr_trees(tmp_path, files: dict[str, str], upstream: dict[str, str] | None = None):
    """A pristine stand-in tree and a ported one holding ``files`` on top of it."""
    pristine, ported = tmp_path / "pristine", tmp_path / "ported"
    for root, content in ((pristine, upstream or {}), (ported, {**(upstream or {}), **files})):
        for rel, text in content.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    return pristine, ported


def test_a_pr_line_naming_the_runtime_is_reported_with_file_and_line(tmp_path):
    readme = "# Example\n\nTrained on gridnav.\nThe Hanoi tasks live elsewhere.\n"
    script = "# ETA as the official ALFWorld / ScienceWorld configs\nENV=webshop\n"
    upstream = {"docs/index.rst": "make_env is upstream's own word here\n"}
    pristine, ported = _pr_trees(tmp_path, {"examples/multi_turn_tcod/README.md": readme,
                                            "examples/multi_turn_tcod/run.sh": script,
                                            "docs/index.rst": upstream["docs/index.rst"] + "new line\n"}, upstream)
    hits = [h for rel, (lines, _) in verify_pr.diff_stats(pristine, ported).items()
            for h in verify_pr.runtime_name_hits(rel, lines)]
    # Only added lines count; the paper's benchmarks may be named where the official configs are cited.
    assert hits == ["examples/multi_turn_tcod/README.md:4: 'Hanoi'", "examples/multi_turn_tcod/run.sh:2: 'webshop'"]
    assert {"hanoi", "make_env", "tcod_prefix_source", "engine_limits"} <= {n.lower() for n in verify_pr.RUNTIME_NAMES}


def test_a_pointer_to_the_standalone_repository_may_name_its_runtime():
    # A Markdown line naming slime-tcod, and the code block its paragraph introduces, say what is found there;
    # the same names elsewhere, in another block or in code, are still reported.
    readme = ("# Example\n\nScienceWorld runs in slime-tcod:\n```bash\npython -m examples.agent_envs.make_data\n```\n"
              "Then:\n```bash\npython -m examples.agent_envs.make_data\n```\n")
    added = list(enumerate(readme.splitlines(), 1))
    assert verify_pr.pointer_lines(readme) == {3, 5}
    assert verify_pr.runtime_name_hits("README.md", added, readme) == ["README.md:9: 'examples.agent_envs'"]
    assert verify_pr.runtime_name_hits("run.py", [(1, "# slime-tcod's ScienceWorld")]) == [
        "run.py:1: 'slime-tcod'", "run.py:1: 'ScienceWorld'"]


def test_runtime_names_match_whole_words_only():
    lines = [(1, "args.rollout_engine_urls[0]"), (2, "the demonstration"), (3, "see the demo."), (4, "my_make_env()")]
    assert verify_pr.runtime_name_hits("f.py", lines) == ["f.py:1: 'rollout_engine_urls'", "f.py:3: 'the demo'"]


def test_caps_fail_when_exceeded_and_counts_are_printed(tmp_path, capsys, monkeypatch):
    example = "x = 1\n" * 824
    pristine, ported = _pr_trees(tmp_path, {"examples/multi_turn_tcod/rollout.py": example,
                                            "slime/rollout/tcod.py": "y = 2\n" * 151})
    monkeypatch.setattr(verify_pr, "FAILED", [])
    monkeypatch.setattr(verify_pr, "missing_linters", lambda: [])
    monkeypatch.setattr(verify_pr, "lint", lambda files, settings, python=None: [])
    monkeypatch.setattr(manifest, "TEST_FILES", ())
    assert verify_pr.main([str(pristine), str(ported)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  size: the example's Python is 824 lines (cap 823)" in out
    assert "FAIL  size: +151 lines under slime/ (cap 150)" in out
    assert "PASS  size: 2 files, +975 lines (cap 2500)" in out
    assert "verify_pr.py counts: example Python 824 lines, slime/ +151 lines, total +975 lines" in out


# ---------------------------------------------------------------------------- cpu_ci.py: upstream's CPU CI jobs
MINI_TEMPLATE = """<% set jobs = {
    'gpu-job': {'tests': [{'test_file': 'test_big.py', 'num_gpus': 8}]},
    'unit': {'cpu': True, 'extra_pip_deps': 'transformers wandb',
             'tests': [{'test_file': 'test_a.py', 'num_gpus': 0}, {'test_file': 'tests/sub/test_b.py', 'num_gpus': 0,
                        'test_args': '-k fast'}]},
    'agent': {'cpu': True, 'tests': [{'test_file': 'test_agent/test_c.py', 'num_gpus': 0}]},
} %>
jobs:
<% for name, config in jobs.items() %>
  << name >>:
    runs-on: << 'ubuntu-latest' if config.get('cpu') else 'self-hosted' >>
    strategy:
      matrix:
        info:
<< config.tests | tojson(indent=2) | indent(10, true) >>
    steps:
<% if config.get('cpu') %>
      - name: Set up Python
        with:
          python-version: '3.10'
      - name: Install dependencies
        run: |
          pip install torch --index-url https://download.pytorch.org/whl/cpu
          pip install pytest numpy
<% if config.get('extra_pip_deps') %>
          pip install << config.extra_pip_deps >>
<% endif %>
      - name: Install
        run: cd $GITHUB_WORKSPACE && pip install -e . --no-deps
<% endif %>
      - name: Execute
        run: echo
<% endfor %>
  changed:
    runs-on: self-hosted
    strategy:
      matrix: ${{ fromJson(needs.detect.outputs.matrix) }}
"""


def _template_tree(root: Path, text: str = MINI_TEMPLATE) -> Path:
    (root / ".github/workflows").mkdir(parents=True)
    (root / ".github/workflows/pr-test.yml.j2").write_text(text)
    return root


def test_cpu_jobs_are_read_from_the_template(tmp_path):
    from tools.slime_pr import cpu_ci

    jobs = cpu_ci.cpu_jobs(_template_tree(tmp_path))
    assert [j.name for j in jobs] == ["unit", "agent"]  # runs-on ubuntu-latest only
    unit, agent = jobs
    assert unit.python == agent.python == "3.10"
    torch_line = ("torch", "--index-url", "https://download.pytorch.org/whl/cpu")
    assert unit.pip == (torch_line, ("pytest", "numpy"), ("transformers", "wandb"))
    assert agent.pip == unit.pip[:2]
    assert unit.tests == (("tests/test_a.py", ""), ("tests/sub/test_b.py", "-k fast"))
    assert agent.tests == (("tests/test_agent/test_c.py", ""),)


def test_a_cpu_job_registering_a_gpu_test_is_refused(tmp_path):
    from tools.slime_pr import cpu_ci

    tree = _template_tree(tmp_path, MINI_TEMPLATE.replace("'test_a.py', 'num_gpus': 0", "'test_a.py', 'num_gpus': 2"))
    with pytest.raises(cpu_ci.CIError, match="num_gpus 2"):
        cpu_ci.cpu_jobs(tree)


def test_torch_comes_from_pypi_when_its_index_is_unreachable(monkeypatch):
    lines = [("torch", "--index-url", "https://download.pytorch.org/whl/cpu"), ("pytest",)]
    assert cpu_ci_env.effective_pip(lines, reachable=True) == (lines, [])
    monkeypatch.delenv("CPU_CI_TORCH", raising=False)
    out, notes = cpu_ci_env.effective_pip(lines, reachable=False)
    assert out == [("torch==2.13.0",), ("pytest",)] and "CUDA build" in notes[0] and "PyPI" in notes[0]
    monkeypatch.setenv("CPU_CI_TORCH", "torch==2.9.1")
    assert cpu_ci_env.effective_pip(lines, reachable=False)[0][0] == ("torch==2.9.1",)


def test_pytest_summaries_are_counted_and_only_all_passed_is_strict(tmp_path):
    assert cpu_ci_env.parse_counts("x\n======= 15 passed, 1 warning in 0.26s =======\n") == {"passed": 15, "warning": 1}
    assert cpu_ci_env.parse_counts("== 3 passed, 1 skipped, 2 errors in 1.00s (0:00:01) ==") == {
        "passed": 3, "skipped": 1, "error": 2}
    assert cpu_ci_env.parse_counts("no summary") == {}
    log = tmp_path / "log"
    assert cpu_ci_env.Result(0, 1.0, {"passed": 15, "warning": 1}, log).strict
    assert not cpu_ci_env.Result(0, 1.0, {"passed": 15, "skipped": 1}, log).strict
    assert not cpu_ci_env.Result(0, 1.0, {}, log).strict and not cpu_ci_env.Result(1, 1.0, {"passed": 2}, log).strict
    assert cpu_ci_env.Result("timeout", 900.0, {}, log).label().startswith("TIMEOUT")


def test_cpu_ci_layers_a_venv_on_another_after_its_own_packages(tmp_path):
    below, above = tmp_path / "below", tmp_path / "above"
    for venv in (below, above):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (cpu_ci_env._site(below) / "only_below.py").write_text("WHERE = 'below'\n")
    (cpu_ci_env._site(below) / "both.py").write_text("WHERE = 'below'\n")
    (cpu_ci_env._site(above) / "both.py").write_text("WHERE = 'above'\n")
    cpu_ci_env._layer(above, below)
    code = "import both, only_below; print(both.WHERE, only_below.WHERE)"
    out = subprocess.run([str(above / "bin/python"), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["above", "below"]


def test_verify_pr_finds_how_ci_would_miss_the_prs_tests(tmp_path, monkeypatch):
    tree = _template_tree(tmp_path / "ported", MINI_TEMPLATE)
    cpu, gpu = "tests/test_a.py", "tests/test_gpu.py"
    (tree / "tests").mkdir()
    (tree / cpu).write_text('NUM_GPUS = 0\n\nif __name__ == "__main__":\n    raise SystemExit(pytest.main([__file__]))\n')
    (tree / gpu).write_text("NUM_GPUS = 3\n")
    monkeypatch.setattr(manifest, "CPU_TEST_FILES", (cpu, "tests/test_missing.py"))
    monkeypatch.setattr(manifest, "TEST_FILES", (cpu, "tests/test_missing.py", gpu))
    monkeypatch.setattr(manifest, "GPU_TEST_FILE", gpu)
    problems = verify_pr.registration_problems(tree, ["tests/conftest.py"], manifest)
    assert problems == [
        "tests/conftest.py: the PR adds a conftest.py; a test stubs what it needs itself",
        "tests/test_missing.py: not in the ported tree",
        "tests/test_missing.py: not registered in a CPU job",
        f"{gpu}: not registered in any GPU job",
    ]
    (tree / cpu).write_text("NUM_GPUS = 8\n")
    assert verify_pr.registration_problems(tree, [], manifest)[:2] == [
        f"{cpu}: NUM_GPUS is 8, want 0", f"{cpu}: does not end with upstream's runner "
        "'raise SystemExit(pytest.main([__file__]))'"]
    assert manifest.GPU_CONFIGS[0][2] == 3  # the GPU test's NUM_GPUS is its default configuration's


def test_linters_come_from_a_cached_venv_of_their_own_or_are_named(tmp_path, monkeypatch, capsys):
    # A fresh clone's venv has no linters: verify.sh must not fail on "linters missing" but make them once,
    # outside the runtime's venv; with VERIFY_NO_INSTALL=1 it names what to install instead.
    monkeypatch.setattr(verify_pr, "missing_linters", lambda: ["black==24.3.0"])
    monkeypatch.setenv("LINTERS_CACHE", str(tmp_path))
    calls = []

    def run(cmd, check):
        calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            Path(cmd[-1], "bin").mkdir(parents=True)
            Path(cmd[-1], "bin", "python").touch()

    monkeypatch.setattr(verify_pr.subprocess, "run", run)
    monkeypatch.setenv("VERIFY_NO_INSTALL", "1")
    assert verify_pr.linter_python() is None and calls == []
    monkeypatch.delenv("VERIFY_NO_INSTALL")
    python = verify_pr.linter_python()
    assert python.startswith(str(tmp_path)) and python.endswith("/bin/python")
    assert calls[0][1:3] == ["-m", "venv"] and calls[1][:4] == [python, "-m", "pip", "install"]
    assert {"black==24.3.0", "isort==5.13.2", "ruff==0.14.7", "autoflake==2.0.2"} <= set(calls[1])
    assert "installing slime's pinned linters" in capsys.readouterr().out
    calls.clear()
    assert verify_pr.linter_python() == python and calls == []  # made once
