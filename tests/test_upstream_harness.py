"""The upstream proof harness (tools/slime_pr/verify.sh, contracts.py, verify_pr.py), without an
upstream checkout: argument handling, refusing trees that are not upstream slime, tree copies and checksums,
the verdict rules, the pytest recorder on a tiny stand-in tree, and the PR's caps and runtime-name checks
on stand-in pristine / ported trees."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.slime_pr import contracts, verify_pr

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
    assert contracts.main(["copy-tree", str(src), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    assert all((dst / rel).is_file() for rel in MARKERS)
    assert not any((dst / j).exists() for j in [".venv", "slime/__pycache__", ".git", "pkg.egg-info"])
    assert os.access(dst / "run.sh", os.X_OK)
    assert contracts.tree_digest(src) == contracts.tree_digest(dst)  # the junk is outside the checksum too


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
    assert contracts.main(["copy-tree", str(src), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    assert (dst / "untracked.txt").is_file() and (dst / ".gitignore").is_file()
    assert not (dst / "ignored").exists() and not (dst / ".git").exists()
    assert not (dst / "slime/utils/types.py").exists()


def test_tree_digest_sees_content_names_and_modes(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = contracts.tree_digest(tmp_path)
    assert contracts.tree_digest(tmp_path) == first
    (tmp_path / "a.py").chmod(0o755)
    moded = contracts.tree_digest(tmp_path)
    assert moded != first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert contracts.tree_digest(tmp_path) != moded
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__/a.pyc").write_bytes(b"\0")
    before = contracts.tree_digest(tmp_path)
    (tmp_path / "b.py").write_text("")
    assert contracts.tree_digest(tmp_path) != before


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


def test_runtime_names_match_whole_words_only():
    lines = [(1, "args.rollout_engine_urls[0]"), (2, "the demonstration"), (3, "see the demo."), (4, "my_make_env()")]
    assert verify_pr.runtime_name_hits("f.py", lines) == ["f.py:1: 'rollout_engine_urls'", "f.py:3: 'the demo'"]


def test_caps_fail_when_exceeded_and_counts_are_printed(tmp_path, capsys, monkeypatch):
    example = "x = 1\n" * 1001
    pristine, ported = _pr_trees(tmp_path, {"examples/multi_turn_tcod/rollout.py": example,
                                            "slime/rollout/tcod.py": "y = 2\n" * 151})
    monkeypatch.setattr(verify_pr, "FAILED", [])
    monkeypatch.setattr(verify_pr.lint, "missing_linters", lambda: [])
    monkeypatch.setattr(verify_pr.lint, "lint", lambda files: [])
    monkeypatch.setattr(verify_pr.manifest, "TEST_FILES", ())
    assert verify_pr.main([str(pristine), str(ported)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  size: the example's Python is 1001 lines (cap 1000)" in out
    assert "FAIL  size: +151 lines under slime/ (cap 150)" in out
    assert "PASS  size: 2 files, +1152 lines (cap 2500)" in out
    assert "verify_pr.py counts: example Python 1001 lines, slime/ +151 lines, total +1152 lines" in out
