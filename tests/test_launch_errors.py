"""Mistakes train.py refuses before Ray in one line ``train.py: error: ...`` (exit 2), --dry-run and a normal start
alike: no usage block, no traceback. Near-miss config keys and train/eval overlap are one-line warnings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import train
from slime.launch.config_keys import CONSUMER_KEYS
from slime.utils.arguments import get_parser

ROOT = Path(__file__).resolve().parents[1]
KNOWN_ENVS = "alfworld, gridnav, hanoi, scienceworld, textworld, webshop"
BASE = ["--num-rollout", "1", "--allow-no-reward"]  # these runs are about their inputs, not their rewards


def _rows(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _task(i, env="gridnav", **extra):
    metadata = {"env": env, "seed": i}
    return {"input": f"task {i}", "label": json.dumps(metadata, sort_keys=True), "metadata": metadata, **extra}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch_errors")
    (root / "a_file").write_text("not a folder\n")
    # Eval rows without labels: same tasks by metadata, whatever their expert actions.
    unlabelled = [{"input": f"task {i}", "metadata": {"env": "gridnav", "seed": i, "expert_actions": ["up"]}}
                  for i in range(4)]
    return {
        "root": root,
        "train": _rows(root / "train.jsonl", [_task(i) for i in range(4)]),
        "heldout": _rows(root / "heldout.jsonl", [_task(i) for i in range(100, 103)]),
        "mixed": _rows(root / "mixed.jsonl", [_task(i) for i in range(2, 6)]),
        "unlabelled": _rows(root / "unlabelled.jsonl", unlabelled),
        "typo_env": _rows(root / "typo_env.jsonl", [_task(0), _task(1, env="gridnv"), _task(2, env="gridnv")]),
        "no_env": _rows(root / "no_env.jsonl", [{"input": "x", "metadata": {"seed": 1}}]),
    }


@pytest.fixture(scope="module", autouse=True)
def model(tmp_path_factory):
    """The dry runs' --hf-checkpoint: a dry run checks the model folder as a real start does."""
    from slime.utils.tiny_models import save_tiny_checkpoint

    MODEL[:] = [str(save_tiny_checkpoint(tmp_path_factory.mktemp("model") / "m", hidden_size=16, num_layers=1,
                                         num_heads=2))]
    return MODEL[0]


MODEL: list[str] = []


def run_main(monkeypatch, capsys, argv, dry_run=True):
    """train.main in-process as ``train.py``; returns (exit code, stdout, stderr). A dry run gets the tiny model
    (the real starts here are refused before or at the pre-flight: no --hf-checkpoint)."""
    monkeypatch.setattr(sys, "argv", ["train.py"])  # the parser's prog
    if dry_run and "--hf-checkpoint" not in argv:
        argv = [*argv, "--hf-checkpoint", MODEL[0]]
    try:
        code = train.main((["--dry-run"] if dry_run else []) + argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, expected):
    assert code == 2, err
    assert err == f"train.py: error: {expected}\n", err
    assert "usage:" not in err and "Traceback" not in err


def refused(monkeypatch, capsys, argv, expected):
    """Refused in --dry-run and in a normal start (before preflight, so before Ray), with the same line."""
    for dry_run in (True, False):
        code, _, err = run_main(monkeypatch, capsys, argv, dry_run=dry_run)
        assert_one_line_error(code, err, expected)


def test_save_that_cannot_be_created(monkeypatch, capsys, data):
    save = data["root"] / "a_file" / "ckpt"
    refused(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--save", str(save)],
            f"--save {save}: cannot create that folder: {data['root'] / 'a_file'} is a file, not a folder")
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--save",
                                                  str(data["root"] / "a_file")])
    assert_one_line_error(code, err, f"--save {data['root'] / 'a_file'}: cannot create that folder: it exists and "
                                     "is not a folder")
    metrics = data["root"] / "a_file" / "metrics"
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--metrics-dir", str(metrics)])
    assert_one_line_error(code, err, f"--metrics-dir {metrics}: cannot create that folder: {data['root'] / 'a_file'} "
                                     "is a file, not a folder")
    # A folder that does not exist yet is fine (created by the first save), and --dry-run creates nothing.
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--save",
                                                  str(data["root"] / "new" / "ckpt")])
    assert code == 0, err
    assert not (data["root"] / "new").exists()


def test_save_under_a_file_stops_a_real_start_before_ray(data):
    save = data["root"] / "a_file" / "ckpt"
    proc = subprocess.run([sys.executable, "train.py", *BASE, "--prompt-data", data["train"], "--save", str(save)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"train.py: error: --save {save}: cannot create that folder: {data['root'] / 'a_file'} "
                           "is a file, not a folder\n")
    assert "ray" not in (proc.stdout + proc.stderr).lower()


TEACHER = ["--use-opd", "--opd-type", "sglang"]
FORM = "is not an http(s)://HOST:PORT/generate URL"
EXAMPLE = "(e.g. http://127.0.0.1:13141/generate, the teacher server's endpoint)"


@pytest.mark.parametrize("url, problem", [
    ("127.0.0.1:13141/generate", "no http:// or https:// scheme"),
    ("ftp://127.0.0.1:13141/generate", "scheme 'ftp' is not http(s)"),
    ("http://127.0.0.1:13141", "no path (add /generate)"),
    ("http://127.0.0.1:13141/v1/completions", "path '/v1/completions' is not /generate"),
    ("http://127.0.0.1:13141/generate/", "path '/generate/' is not /generate"),
    ("http://127.0.0.1:13141/generate?x=1", "a query or fragment after /generate"),
    ("http://127.0.0.1/generate", "no port"),
    ("http://127.0.0.1:abc/generate", "port 'abc' is not a number"),
])
def test_rm_url_must_be_a_generate_url(monkeypatch, capsys, data, url, problem):
    refused(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], *TEACHER, "--rm-url", url],
            f"--rm-url {url!r} {FORM}: {problem} {EXAMPLE}")


def test_a_good_rm_url_passes(monkeypatch, capsys, data):
    for url in ("http://127.0.0.1:13141/generate", "https://teacher.internal:443/generate"):
        code, _, err = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], *TEACHER, "--rm-url", url])
        assert code == 0, err


def test_rm_url_with_an_in_trainer_teacher_is_refused(monkeypatch, capsys, data):
    url = "http://127.0.0.1:13141/generate"
    refused(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--use-opd", "--opd-type", "megatron",
                                  "--opd-teacher-load", str(ROOT), "--rm-url", url],
            f"--rm-url {url} is set but --opd-type megatron scores with the in-trainer teacher (--opd-teacher-load), "
            "so no server at --rm-url would be asked: drop --rm-url, or use --opd-type sglang for a teacher server")


ENV = ["--max-turns", "3", "--rollout-interaction-env-path", "examples.agent_envs"]


def test_a_task_whose_environment_no_module_serves(monkeypatch, capsys, data):
    refused(monkeypatch, capsys, [*BASE, *ENV, "--prompt-data", data["typo_env"]],
            f"--prompt-data {data['typo_env']} line 2: environment 'gridnv' is served by no module of "
            f"--rollout-interaction-env-path examples.agent_envs (known: {KNOWN_ENVS}); 1 more row(s) like it")
    refused(monkeypatch, capsys, [*BASE, *ENV, "--prompt-data", data["train"], "--eval-prompt-data", "held",
                                  data["no_env"]],
            f"--eval-prompt-data held {data['no_env']} line 1: no metadata['env'], by which "
            f"--rollout-interaction-env-path examples.agent_envs (known: {KNOWN_ENVS}) picks the environment")
    # One environment's own module does not dispatch: its rows are not asked for metadata['env'].
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--max-turns", "3", "--rollout-interaction-env-path",
                                                  "examples.multi_turn_tcod.envs.gridnav", "--prompt-data",
                                                  data["no_env"]])
    assert code == 0, err


BAD_MODULE = 'import os\n\nraise RuntimeError("the game engine is not installed\\nsecond line")\n'


def test_an_environment_that_raises_at_import(monkeypatch, capsys, data, tmp_path):
    (tmp_path / "env_raising_at_import.py").write_text(BAD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    where = f"(at {tmp_path / 'env_raising_at_import.py'}:3)"
    common = [*BASE, "--prompt-data", data["train"], "--max-turns", "3"]
    refused(monkeypatch, capsys, [*common, "--rollout-interaction-env-path", "env_raising_at_import"],
            "--rollout-interaction-env-path 'env_raising_at_import' raised while importing: RuntimeError: the game "
            f"engine is not installed {where}")
    py_file = str(tmp_path / "env_raising_at_import.py")
    refused(monkeypatch, capsys, [*common, "--rollout-interaction-env-path", py_file],
            f"--rollout-interaction-env-path {py_file!r} raised while importing: RuntimeError: the game engine is "
            f"not installed {where}")
    # A function plugin's module too.
    refused(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--custom-rm-path",
                                  "env_raising_at_import.reward"],
            "--custom-rm-path 'env_raising_at_import.reward' raised while importing: RuntimeError: the game engine "
            f"is not installed {where}")


def _parse_error_cli(*argv):
    proc = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def test_abbreviated_flags_are_refused():
    code, err = _parse_error_cli("--dry-run", *BASE, "--save-int", "1")
    assert_one_line_error(code, err, "unrecognized arguments: --save-int 1 (--save-int is short for --save-interval: "
                                     "flags are not abbreviated, spell it out)")


def test_abbreviations_are_off_in_the_parser():
    assert get_parser().allow_abbrev is False
    with pytest.raises(SystemExit):
        get_parser().parse_args(["--num-roll", "2"])


def test_type_and_choice_errors_are_one_line(monkeypatch, capsys):
    code, err = _parse_error_cli("--dry-run", *BASE, "--lr", "abc")
    assert_one_line_error(code, err, "argument --lr: invalid float value: 'abc'")
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--tcod-mode", "x"])
    assert_one_line_error(code, err, "argument --tcod-mode: invalid choice: 'x' (choose from 'f2b', 'b2f')")
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--num-rollut", "2"])
    assert_one_line_error(code, err, "unrecognized arguments: --num-rollut 2 (--num-rollut: did you mean "
                                     "--num-rollout?)")
    code, _, err = run_main(monkeypatch, capsys, [*BASE, "--eval-interval"])
    assert_one_line_error(code, err, "argument --eval-interval: expected one argument")


def test_help_still_prints_usage_and_exits_0(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, ["--help"], dry_run=False)
    assert code == 0 and err == ""
    assert out.startswith("usage: train.py") and "--save-interval SAVE_INTERVAL" in out


def _config(tmp_path, text) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_a_near_miss_config_key_is_warned(monkeypatch, capsys, data, tmp_path):
    config = _config(tmp_path, "max_turns: 3\nmax_turn_respone_len: 64\nmy_plugin_setting: 1\nci_test: false\n"
                               "rollout_interaction_env_path: examples.agent_envs\n")
    warning = ("warning: --custom-config-path key 'max_turn_respone_len' is read by nothing; did you mean "
               "'max_turn_response_len'?")
    argv = [*BASE, "--prompt-data", data["train"], "--custom-config-path", config]
    code, out, err = run_main(monkeypatch, capsys, argv)
    assert code == 0, err
    assert [line for line in out.splitlines() if "warning" in line] == [f"  {warning}"]
    # A normal start prints it before anything starts (here preflight then stops: no --hf-checkpoint).
    code, _, err = run_main(monkeypatch, capsys, argv, dry_run=False)
    lines = err.splitlines()
    assert f"train.py: {warning}" in lines[:-1] and lines[-1].startswith("train.py: error: --hf-checkpoint")
    assert code == 2 and "Traceback" not in err


def test_a_hyphenated_or_swapped_key_is_a_near_miss_too(monkeypatch, capsys, data, tmp_path):
    config = _config(tmp_path, "rollout-batch-szie: 4\n")
    code, out, _ = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--custom-config-path",
                                                  config])
    assert code == 0
    assert ("  warning: --custom-config-path key 'rollout_batch_szie' is read by nothing; did you mean "
            "'rollout_batch_size'?") in out.splitlines()


def test_consumer_keys_cover_what_the_shipped_code_reads():
    """Every args attribute the shipped code reads is a flag, a consumer key, or set by the runtime itself."""
    dests = {action.dest for action in get_parser()._actions}
    set_by_runtime = {"engine_limits", "rollout_engine_urls", "rollout_model_path", "sglang_router_external"}
    # Flags of slime that the PRs' shared files read and this runtime does not take: sglang_router's
    # --router-policy (read with a default), Megatron's --finetune (the KL controller's restore, slime only),
    # slime's --rollout-sample-hook-path (which --use-tcod extends; this runtime's rollout runs no sample hooks).
    slime_only = {"router_policy", "finetune", "rollout_sample_hook_path"}
    own_clis = {"slime/backends/hf_engine/__main__.py", "slime/rollout/expert_sft.py",
                "slime/backends/sglang_utils/serve.py",  # train.py's parser plus its own --port / --parent-pid
                "examples/multi_turn_tcod/envs/make_data.py", "examples/agent_envs/make_data.py"}
    read = set()
    for path in [*ROOT.glob("slime/**/*.py"), *ROOT.glob("examples/**/*.py")]:
        if str(path.relative_to(ROOT)) in own_clis:
            continue
        text = path.read_text()
        read |= set(re.findall(r"getattr\(\s*(?:self\.)?args\s*,\s*[\"'](\w+)[\"']", text))
        read |= set(re.findall(r"\bargs\.([a-z_][a-z0-9_]*)\b", text))
    public = {name for name in read if not name.startswith("_")}  # a private attribute is no YAML key
    assert public - dests - CONSUMER_KEYS - set_by_runtime - slime_only == set()
    assert CONSUMER_KEYS <= read  # none is stale


def test_eval_sharing_training_tasks_is_warned(monkeypatch, capsys, data):
    def warnings_of(*eval_sets, dry_run=True):
        argv = [*BASE, "--prompt-data", data["train"], "--eval-prompt-data", *eval_sets]
        code, out, err = run_main(monkeypatch, capsys, argv, dry_run=dry_run)
        return code, [line.strip() for line in (out + err).splitlines() if "warning" in line]

    code, lines = warnings_of("same", data["train"], "held", data["heldout"], "mixed", data["mixed"])
    assert code == 0
    assert lines == ["warning: --eval-prompt-data same shares 4 of 4 tasks with --prompt-data: its scores are not on "
                     "held-out tasks",
                     "warning: --eval-prompt-data mixed shares 2 of 4 tasks with --prompt-data: its scores are not on "
                     "held-out tasks"]
    # Without labels the metadata minus expert_actions is the task (make_data's label is that metadata's JSON).
    _, lines = warnings_of("bare", data["unlabelled"], dry_run=False)
    assert lines[0] == ("train.py: warning: --eval-prompt-data bare shares 4 of 4 tasks with --prompt-data: its "
                        "scores are not on held-out tasks")


def test_the_same_puzzle_under_another_seed_counts_as_shared(tmp_path):
    from argparse import Namespace

    from slime.launch.data_overlap import overlap_warnings

    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    train = write("train.jsonl", [{"input": "pegs: A=[3,2,1]", "label": '{"seed": 1}'}])
    same_puzzle = write("eval.jsonl", [{"input": "pegs: A=[3,2,1]", "label": '{"seed": 7}'},
                                       {"input": "pegs: B=[3,2,1]", "label": '{"seed": 8}'}])
    args = Namespace(prompt_data=train, eval_prompt_data=["hanoi", same_puzzle], input_key="input",
                     label_key="label", metadata_key="metadata")
    assert overlap_warnings(args) == ["warning: --eval-prompt-data hanoi shares 1 of 2 tasks with --prompt-data: "
                                      "its scores are not on held-out tasks"]


def test_the_runtimes_own_warnings_print_as_one_line(data):
    argv = [*BASE, "--dry-run", "--hf-checkpoint", MODEL[0], "--prompt-data", data["train"], "--use-opd", "--opd-type", "sglang",
            "--rm-url", "http://127.0.0.1:13141/generate", "--rollout-temperature", "0.5"]
    code, err = _parse_error_cli(*argv)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "--rollout-temperature 0.5" in line]
    assert lines == ["train.py: warning: --rollout-temperature 0.5 with --opd-type sglang: the teacher server "
                     "scores at temperature 1, so the OPD term compares distributions at different temperatures"]
    assert "UserWarning" not in err and "warnings.warn(" not in err


def test_an_rm_url_nothing_reads_is_warned(monkeypatch, capsys, data):
    url = "http://127.0.0.1:13141/generate"
    code, out, err = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--rm-url", url])
    assert code == 0
    assert f"warning: --rm-url {url} is set but nothing reads it: without --use-opd" in out + err
    code, out, err = run_main(monkeypatch, capsys, [*BASE, "--prompt-data", data["train"], "--rm-url", url,
                                                    "--use-opd", "--opd-type", "sglang"])
    assert code == 0 and "nothing reads it" not in out + err
