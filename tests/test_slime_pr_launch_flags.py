"""tools/slime_pr/check_launch_flags.py: its argument extraction (always), and the full check (opt-in).

The full check needs a pristine upstream slime tree and Megatron-LM at upstream's pinned commit, both
passed by environment (see the checker's docstring for how to get them); it is skipped without them:

    SLIME_UPSTREAM_DIR=/path/slime MEGATRON_LM_DIR=/path/mlm [SGLANG_SERVER_ARGS=sglang-*.whl] pytest ...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "slime_pr"))

import check_launch_flags as clf  # noqa: E402

# Stand-ins for the upstream files the extraction reads (not upstream's content).
MODEL_ARGS = "MODEL_ARGS=(\n   --swiglu\n   --num-layers 2\n)\n"
COMMAND_UTILS = """
repo_base_dir = "/nowhere"
def exec_command(cmd, capture_output=False):
    raise AssertionError("the checker must not run commands")
def convert_checkpoint(**kwargs):
    raise AssertionError("the checker must not convert")
def get_default_wandb_args(test_file, run_name_prefix=None, run_id=None):
    return ""
def save_to_temp_file(text, ext):
    raise AssertionError("the checker must keep its temp files to itself")
def execute_train(**kwargs):
    raise AssertionError("the checker must replace execute_train")
"""


def _fake_tree(root: Path) -> Path:
    """The PR's launch script, YAML and e2e test in a tree with stand-in model scripts and command_utils."""
    for rel in (clf.SCRIPT, "examples/multi_turn_tcod/multi_turn_tcod_config.yaml", clf.E2E_TEST):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    (root / "scripts/models").mkdir(parents=True)
    for model in ("qwen3-8B", "qwen3-1.7B", "qwen3-0.6B"):
        (root / f"scripts/models/{model}.sh").write_text(MODEL_ARGS)
    package = root / "slime/utils/external_utils"
    package.mkdir(parents=True)
    for init in (root / "slime", root / "slime/utils", package):
        (init / "__init__.py").write_text("")
    (package / "command_utils.py").write_text(COMMAND_UTILS)
    return root


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, flag
    return argv[argv.index(flag) + 1]


def test_flags_are_the_option_tokens():
    argv = ["--lr", "1e-6", "--eps-clip=0.2", "--rm-url", "http://h:1/generate", "-1", "--colocate"]
    assert clf.flags_of(argv) == ["--lr", "--eps-clip", "--rm-url", "--colocate"]


def test_launch_script_arguments_are_extracted_with_stubs(tmp_path):
    tree = _fake_tree(tmp_path / "tree")
    launches = clf.script_launches(tree, tmp_path)
    assert [launch.problems for launch in launches] == [[]] * len(clf.SCRIPT_RUNS)
    for run, launch in zip(clf.SCRIPT_RUNS, launches, strict=True):
        argv = launch.argv
        assert argv[:4] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", run.get("ACTOR_GPUS", "2")]
        gpus = int(run.get("NUM_GPUS", 8)) - int(run.get("TEACHER_GPUS", 2)) - int(run.get("ACTOR_GPUS", 2))
        assert _value(argv, "--rollout-num-gpus") == str(gpus)  # 4 of 8, or 2 of 4
        assert _value(argv, "--tensor-model-parallel-size") == run.get("TP", "2")
        assert _value(argv, "--hf-checkpoint") == run.get("STUDENT", "/root/models/Qwen3-8B")
        assert argv[argv.index("--rollout-num-gpus") + 2 : argv.index("--rollout-num-gpus") + 5] == [
            "--swiglu",
            "--num-layers",
            "2",
        ]  # MODEL_ARGS, sourced by the script itself
        assert _value(argv, "--tcod-mode") == run["TCOD_MODE"]
        # The official settings.
        for flag, want in (("--opd-kl-coef", "1.0"), ("--lr", "1e-6"), ("--eps-clip", "0.2")):
            assert _value(argv, flag) == want
        assert (_value(argv, "--rollout-batch-size"), _value(argv, "--eval-temperature")) == ("16", "0.4")
        config = yaml.safe_load(Path(launch.cwd, _value(argv, "--custom-config-path")).read_text())
        eta = "6" if run["TCOD_MODE"] == "f2b" else "5"
        assert (config["max_turns"], _value(argv, "--tcod-eta"), _value(argv, "--num-rollout")) == (12, eta, "96")
        # k_max is the YAML's max_turns (--tcod-k-max's default); upstream's default rollout function.
        assert "--tcod-k-max" not in argv and "--rollout-function-path" not in argv
        assert config["rollout_interaction_env_path"] == "examples.multi_turn_tcod.envs.gridnav"
        assert launch.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and str(tree) in launch.env["PYTHONPATH"]
        assert _value(launch.teacher_argv, "--tp-size") == run.get("TEACHER_GPUS", "2")
        assert _value(launch.teacher_argv, "--model-path") == run.get("TEACHER", "/root/models/Qwen3-32B")


def test_e2e_test_arguments_are_captured_without_running_anything(tmp_path):
    tree = _fake_tree(tmp_path / "tree")
    code = (
        "import json, sys; from pathlib import Path; import check_launch_flags as c\n"
        "out = [dict(name=l.name, argv=l.argv, teacher=l.teacher_argv, problems=l.problems)"
        " for l in c.test_launches(Path(sys.argv[1]), Path(sys.argv[2]))]\n"
        "print(json.dumps(out))\n"
    )
    # A fresh interpreter away from this repository: the stand-in slime package must win over ours.
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT / 'tools' / 'slime_pr'}"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tree), str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    launches = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(launches) == len(clf.TEST_RUNS)
    for (tcod_mode, opd_type), launch in zip(clf.TEST_RUNS, launches, strict=True):
        argv = launch["argv"]
        assert launch["problems"] == [] and argv[:3] == ["--swiglu", "--num-layers", "2"]
        assert (_value(argv, "--tcod-mode"), _value(argv, "--opd-type")) == (tcod_mode, opd_type)
        assert ("--rm-url" in argv) == (opd_type == "sglang") == (launch["teacher"] is not None)
        assert ("--opd-teacher-load" in argv) == (opd_type == "megatron")
        assert yaml.safe_load(Path(_value(argv, "--custom-config-path")).read_text())["max_turns"] == 4


def test_server_args_are_read_like_sglangs_dataclass_cli():
    source = """
class ServerArgs:
    model_path: A[str, Arg(help="m", aliases=["--model"])]
    tp_size: A[int, Arg(help="t", aliases=["--tensor-parallel-size"])] = 1
    enable_metrics: A[bool, "e"] = False
    hidden: A[int, Arg(help="h", no_cli=True)] = 0
    cuda_graph_bs: A[Optional[List[int]], "b"] = None
    tp_size: A[int, Arg(help="again", aliases=["--tp"])] = 2
    plain: int = 3

    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--cuda-graph-max-bs", type=int, dest="cuda_graph_max_bs_decode", action=Alias)
        parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction)
"""
    specs = clf.server_args_specs(source)
    assert [s["names"] for s in specs] == [
        ["--model-path", "--model"],
        ["--tp-size", "--tp"],  # the later declaration wins, at the first one's place
        ["--enable-metrics"],
        ["--cuda-graph-bs"],
        ["--cuda-graph-max-bs"],
        ["--disable-cuda-graph"],
    ]
    assert [s["kind"] for s in specs] == ["str", "int", "bool", "list", "int", "bool"]
    assert specs[1]["default"] == 2 and specs[4]["dest"] == "cuda_graph_max_bs_decode"
    problems = clf.teacher_problems(["--model-path", "m", "--tp-s", "2", "--enable-metrics"], specs)
    assert problems == [
        "teacher server flag --tp-s is not a ServerArgs flag (argparse would take it as an abbreviation of --tp-size)"
    ]


def test_server_args_split_into_namespace_classes_are_read_from_the_wheel(tmp_path):
    # Newer sglang releases declare ServerArgs' fields in sglang/srt/arg_groups/fields/*.py namespaces.
    server_args = """
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--reasoning-parser", type=str)
"""
    parallel = """
class Parallel(msgspec.Struct):
    _NS_PATH = "parallel"
    tp_size: A[int, Arg(help="t", aliases=["--tensor-parallel-size"])] = 1
    enable_dp_attention: A[bool, "d"] = False

class NotANamespace:
    ignored: A[int, "x"] = 0
"""
    wheel = tmp_path / "sglang-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/srt/server_args.py", server_args)
        zf.writestr("sglang/srt/arg_groups/fields/parallel.py", parallel)
        zf.writestr("sglang/srt/arg_groups/fields/__init__.py", "")
    specs = clf.read_server_args(wheel)
    assert [s["names"] for s in specs] == [
        ["--tp-size", "--tensor-parallel-size"],
        ["--enable-dp-attention"],
        ["--reasoning-parser"],
    ]
    assert clf.teacher_problems(["--tensor-parallel-size", "2", "--ignored", "1"], specs) == [
        "teacher server flag --ignored is not a ServerArgs flag"
    ]


def test_yaml_keys_given_on_the_command_line_are_reported(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_turns: 4\nenv_step_timeout: 60\n")
    args = type("Args", (), {"custom_config_path": str(config)})()
    assert clf.yaml_problems(args, ["--lr", "--max-turns"]) == [
        "max_turns: set both by --max-turns and by the YAML (upstream keeps the YAML's)"
    ]


@pytest.mark.skipif(
    not (os.environ.get("SLIME_UPSTREAM_DIR") and os.environ.get("MEGATRON_LM_DIR")),
    reason="set SLIME_UPSTREAM_DIR (pristine upstream slime) and MEGATRON_LM_DIR (Megatron-LM at MEGATRON_COMMIT)",
)
def test_launch_flags_on_the_ported_upstream_tree(tmp_path):
    from tools.slime_pr import port

    tree = tmp_path / "slime"
    shutil.copytree(os.environ["SLIME_UPSTREAM_DIR"], tree, ignore=shutil.ignore_patterns(".git"))
    port.port(tree, commit=False)
    cmd = [sys.executable, str(ROOT / "tools/slime_pr/check_launch_flags.py"), str(tree)]
    cmd += ["--megatron-dir", os.environ["MEGATRON_LM_DIR"]]
    if os.environ.get("SGLANG_SERVER_ARGS"):
        cmd += ["--sglang-server-args", os.environ["SGLANG_SERVER_ARGS"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("launches, 0 problems")


def test_pr_test_entries_go_after_the_opd_test_and_into_the_cpu_job_once():
    from tools.slime_pr import manifest as entry

    old = f"{{'test_file': '{entry.TEST_FILE}', 'num_gpus': 4}},"  # an older registration: replaced
    template = (
        f"<% set megatron_tests = [\n    {entry.ANCHOR}\n    {old}\n    {{'test_file': 'x.py', 'num_gpus': 4}},\n] %>\n"
        f"<% set jobs = {{\n    {entry.CPU_JOB_LINE}\n      'tests': [\n        {{'test_file': 'a.py', 'num_gpus': 0}},\n"
        "      ],\n    },\n} %>\n"
    )
    edited = entry.edit_template(template)
    lines = edited.splitlines()
    assert lines[2 : 2 + len(entry.GPU_ENTRIES)] == ["    " + e for e in entry.GPU_ENTRIES] and old not in edited
    assert lines[2 + len(entry.GPU_ENTRIES)] == "    {'test_file': 'x.py', 'num_gpus': 4},"
    cpu_at = lines.index("        {'test_file': 'a.py', 'num_gpus': 0},") + 1
    assert lines[cpu_at : cpu_at + 4] == ["        " + e for e in entry.CPU_ENTRIES] + ["      ],"]
    assert entry.edit_template(edited) == edited
    # One entry per configuration, each with the GPUs it uses; the file's NUM_GPUS is the default's.
    assert [(m, o, n) for m, o, n in entry.GPU_CONFIGS if o == "sglang"] == [("b2f", "sglang", 3)]
    assert {m for m, _, _ in entry.GPU_CONFIGS} == {"f2b", "b2f"} and len(entry.GPU_CONFIGS) == 2
    assert {n for _, o, n in entry.GPU_CONFIGS if o == "megatron"} == {2}
    assert "NUM_GPUS = 3" in (ROOT / "tests" / entry.TEST_FILE).read_text()
    with pytest.raises(entry.PortError):
        entry.edit_template(template.replace(entry.ANCHOR, ""))
    with pytest.raises(entry.PortError):
        entry.edit_template(template.replace(entry.CPU_JOB_LINE, "'other-job': {"))
