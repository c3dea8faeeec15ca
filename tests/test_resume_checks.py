"""``--load`` says what it resumes and refuses, before Ray, a resume that changes the run
(slime/checkpoint/resume.py; its lines: slime/launch/resume_notes.py).

The checkpoint is a real one: the FSDP trainer (one in-process group, no Ray) written by save_checkpoint
at iteration 11 of a TCOD f2b run; the messages are read through ``train.main(... --dry-run)`` or, for the
ordering against Ray, a real run whose Ray start is replaced by a stop.
"""

from __future__ import annotations

import json
import shutil
from argparse import Namespace

import pytest
import transformers
from fsdp_helpers import make_args, make_samples, single_thread

import train
from examples.agent_envs.make_data import task_rows
from slime.checkpoint.driver import save_checkpoint
from slime.checkpoint.files import MANIFEST, CheckpointError, read_json, verify_manifest, write_manifest
from slime.checkpoint.layout import iteration_dir
from slime.checkpoint.resume import flag_changes, kl_controller_changes, model_changes
from slime.checkpoint.run_config import RUN_CONFIG
from slime.launch.checks import check_launch
from slime.launch.preflight import preflight
from slime.utils.arguments import parse_args
from slime.utils.kl_controller import AdaptiveKLController, save_kl_controller
from slime.utils.tiny_models import save_tiny_checkpoint

transformers.utils.logging.disable_progress_bar()
STEP = 11


class StubData:
    def state_dict(self):
        return {"offset": 0}


class RayStarted(Exception):
    """Raised where train.py would start Ray: everything before it has run."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from slime.backends.fsdp_utils.actor import FSDPActor
    from slime.backends.fsdp_utils.launch import ensure_single_process_group

    root = tmp_path_factory.mktemp("resume")
    student = str(save_tiny_checkpoint(root / "student", hidden_size=32, num_layers=2, num_heads=2, seed=0))
    wide = str(save_tiny_checkpoint(root / "wide", hidden_size=64, num_layers=3, num_heads=2, seed=0))
    data = root / "tasks.jsonl"
    rows = task_rows("gridnav", 4, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=5)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--hf-checkpoint", student, "--prompt-data", str(data), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "1", "--num-rollout", "20", "--rollout-max-response-len", "200",
            "--max-turn-response-len", "6", "--max-turns", "6", "--rollout-interaction-env-path", "examples.agent_envs",
            "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", student, "--use-tcod", "--tcod-mode", "f2b",
            "--tcod-eta", "3", "--lr", "1e-3"]
    save = root / "ckpt"
    args = parse_args(argv=[*base, "--save", str(save)])
    check_launch(args)  # as train.py: the defaults it fills are part of the saved configuration
    with single_thread():
        ensure_single_process_group()
        actor = FSDPActor(args, 0, 1)
        save_checkpoint(save, STEP, trainer=actor, data_source=StubData(), kl_controller=None)
    return {"root": root, "base": base, "save": save, "student": student, "wide": wide}


def dry_run(setup, capsys, *extra, load=None):
    rc = train.main([*setup["base"], "--load", str(load or setup["save"]), *extra, "--dry-run"])
    out, err = capsys.readouterr()
    return rc, out, err


def error_line(err: str) -> str:
    """The refusal: exactly one line, no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("train.py")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------- what is resumed
def test_the_resume_line_names_iteration_next_step_and_curriculum_depth(setup, capsys):
    rc, out, _ = dry_run(setup, capsys)
    assert rc == 0
    assert (f"resuming from iteration 11 of {setup['save']} (iter_0000011): the next rollout step is 12; the TCOD "
            "curriculum continues at depth k(12) = 5") in out  # min(1 + 12 // 3, 6)


def test_a_real_run_prints_the_resume_line_before_ray(setup, capsys, monkeypatch):
    seen = {}

    def stop(args):
        seen["engines"] = args.rollout_model_path
        raise RayStarted

    monkeypatch.setattr(train, "_init_ray", stop)
    with pytest.raises(RayStarted):
        train.main([*setup["base"], "--load", str(setup["save"])])
    err = capsys.readouterr().err
    assert (f"train.py: resuming from iteration 11 of {setup['save']} (iter_0000011): the next rollout step is 12; "
            "the TCOD curriculum continues at depth k(12) = 5") in err
    assert seen["engines"] == str(iteration_dir(setup["save"], STEP) / "model" / "hf")


def test_a_resume_past_num_rollout_says_nothing_is_left(setup, capsys):
    rc, out, _ = dry_run(setup, capsys, "--num-rollout", "12")
    assert rc == 0 and "the next rollout step is 12, but --num-rollout 12 ends before it: nothing is left" in out


@pytest.mark.parametrize("name", ["missing", "empty"])
def test_a_load_folder_without_checkpoint_starts_from_step_0(setup, capsys, name):
    folder = setup["root"] / name
    if name == "empty":
        folder.mkdir(exist_ok=True)
    rc, out, _ = dry_run(setup, capsys, load=folder)
    assert rc == 0 and f"--load {folder} holds no checkpoint yet: starting from step 0" in out
    args = parse_args(argv=[*setup["base"], "--load", str(folder)])
    assert preflight(args).load_folder is None  # the real run starts fresh too


def test_a_named_iteration_that_is_missing_is_still_an_error(setup, capsys):
    rc, _, err = dry_run(setup, capsys, load=setup["save"] / "iter_0000003")
    assert rc == 2 and "iter_0000003" in error_line(err)


# ---------------------------------------------------------------------------- refused
def test_changed_tcod_flags_are_refused_in_one_line_naming_both_values(setup, capsys):
    rc, _, err = dry_run(setup, capsys, "--tcod-mode", "b2f", "--tcod-eta", "5")
    assert rc == 2
    assert error_line(err) == (f"train.py: error: --load {setup['save']}: this run changes what the checkpoint's run "
                               "means: --tcod-mode f2b -> b2f, --tcod-eta 3 -> 5 (start a new --save folder, or "
                               "restore the flags)")


def test_changed_batch_sizes_and_turns_are_refused(setup, capsys):
    rc, _, err = dry_run(setup, capsys, "--rollout-batch-size", "4", "--max-turns", "5")
    line = error_line(err)
    assert rc == 2
    assert "--rollout-batch-size 2 -> 4, --global-batch-size 2 -> 4, --max-turns 6 -> 5" in line
    assert "--tcod-k-max 6 -> 5" in line  # k_max defaults to max_turns: the curriculum's ceiling moved


def test_another_architecture_is_refused_before_ray(setup, capsys, monkeypatch):
    monkeypatch.setattr(train, "_init_ray", lambda args: pytest.fail("Ray started"))
    argv = [*setup["base"], "--hf-checkpoint", setup["wide"], "--load", str(setup["save"])]
    assert train.main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert (f"the model (--hf-checkpoint {setup['wide']}) is another architecture than the checkpoint's: "
            "hidden_size 32 -> 64, num_hidden_layers 2 -> 3") in line


def test_a_changed_lr_needs_one_of_megatrons_scheduler_flags(setup, capsys):
    rc, _, err = dry_run(setup, capsys, "--lr", "5e-4")
    line = error_line(err)
    assert rc == 2
    assert "the optimizer's settings change: --lr 0.001 -> 0.0005" in line
    assert "--override-opt_param-scheduler" in line and "--use-checkpoint-opt_param-scheduler" in line


def test_override_takes_the_new_lr_and_use_checkpoint_keeps_the_old_one_with_a_line(setup, capsys):
    rc, out, _ = dry_run(setup, capsys, "--lr", "5e-4", "--override-opt_param-scheduler")
    assert rc == 0
    assert ("--override-opt_param-scheduler: the restored optimizer takes this run's settings: --lr 0.001 -> 0.0005"
            in out)
    rc, out, _ = dry_run(setup, capsys, "--lr", "5e-4", "--use-checkpoint-opt_param-scheduler")
    assert rc == 0
    assert ("--use-checkpoint-opt_param-scheduler: the checkpoint's optimizer settings are kept: --lr 0.001 (this "
            "run's 0.0005 is ignored)") in out
    with pytest.raises(SystemExit):  # Megatron-LM refuses the pair too
        parse_args(argv=[*setup["base"], "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"])


def test_flags_that_do_not_change_the_run_may_change(setup, capsys):
    rc, out, err = dry_run(setup, capsys, "--num-rollout", "40", "--save-interval", "5", "--save",
                           str(setup["root"] / "elsewhere"), "--eval-interval", "10", "--micro-batch-size", "2")
    assert rc == 0, err
    assert "resuming from iteration 11" in out


def test_a_checkpoint_without_run_config_resumes_with_a_note(setup, capsys):
    old = setup["root"] / "old"
    shutil.copytree(iteration_dir(setup["save"], STEP), iteration_dir(old, STEP))
    (iteration_dir(old, STEP) / RUN_CONFIG).unlink()
    write_manifest(iteration_dir(old, STEP))
    rc, out, _ = dry_run(setup, capsys, "--tcod-eta", "5", load=old)
    assert rc == 0  # nothing to compare the flags with
    assert f"--load {old}: iter_0000011 has no run_config.json (written before run configurations were saved)" in out


def _adaptive_copy(setup, name):
    """The checkpoint as an adaptive run would have left it: its controller's state in kl_ctrl/."""
    copy = setup["root"] / name
    if not copy.exists():
        shutil.copytree(iteration_dir(setup["save"], STEP), iteration_dir(copy, STEP))
        ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=64.0)
        ctrl.update(0.3, 2)
        save_kl_controller(ctrl, str(iteration_dir(copy, STEP)), STEP)
        write_manifest(iteration_dir(copy, STEP))
    return copy


def test_resuming_an_adaptive_run_without_its_controller_is_refused_before_ray(setup, capsys, monkeypatch):
    monkeypatch.setattr(train, "_init_ray", lambda args: pytest.fail("Ray started"))
    copy = _adaptive_copy(setup, "adaptive")
    assert train.main([*setup["base"], "--load", str(copy)]) == 2
    assert error_line(capsys.readouterr().err) == (
        f"train.py: error: --load {copy}: --kl-ctrl adaptive -> fixed: the checkpoint's run adapted the KL "
        "coefficient (now 0.0503125, target 0.1); resume it with --kl-ctrl adaptive --kl-target 0.1, or start a "
        "new --save folder")


def test_the_kl_controller_of_a_resume_must_be_the_checkpoints(tmp_path):
    def args(kl_ctrl, target=0.1, horizon=64.0):
        return Namespace(kl_ctrl=kl_ctrl, kl_coef=0.05, kl_target=target, kl_horizon=horizon, load="ckpt")

    fixed = iteration_dir(tmp_path, STEP)
    fixed.mkdir()
    assert kl_controller_changes(fixed, STEP, args("fixed", None, None)) == (None, {})
    problem, _ = kl_controller_changes(fixed, STEP, args("adaptive"))
    assert problem.startswith("--kl-ctrl adaptive: the checkpoint has no KL controller state file")
    assert "kept --kl-coef fixed or predates" in problem
    save_kl_controller(AdaptiveKLController(0.05, target_kl=0.1, horizon=64.0), str(fixed), STEP)
    assert kl_controller_changes(fixed, STEP, args("adaptive")) == (None, {})
    # A new target or horizon is allowed (the saved coefficient goes on with it) and named for the resume notes.
    assert kl_controller_changes(fixed, STEP, args("adaptive", 0.2, 128.0)) == (
        None, {"--kl-target": (0.1, 0.2), "--kl-horizon": (64.0, 128.0)})


# ---------------------------------------------------------------------------- saved with the checkpoint
def test_run_config_is_saved_and_covered_by_the_checksums(setup):
    folder = iteration_dir(setup["save"], STEP)
    saved = read_json(folder / RUN_CONFIG)
    assert saved["args"]["tcod_eta"] == 3 and saved["args"]["tcod_k_max"] == 6
    assert saved["model_config"]["hidden_size"] == 32
    assert RUN_CONFIG in read_json(folder / MANIFEST)["files"]
    copy = setup["root"] / "tampered"
    shutil.copytree(folder, copy)
    (copy / RUN_CONFIG).write_text((copy / RUN_CONFIG).read_text().replace('"tcod_eta": 3', '"tcod_eta": 4'))
    with pytest.raises(CheckpointError, match="run_config.json"):
        verify_manifest(copy)


# ---------------------------------------------------------------------------- the comparison itself
def _ns(**kw):
    defaults = {"use_tcod": False, "tcod_mode": "f2b", "tcod_eta": None, "max_turns": 4, "rollout_batch_size": 8}
    return Namespace(**{**defaults, **kw})


def test_tcod_flags_count_only_when_both_runs_use_tcod():
    saved = vars(_ns(tcod_mode="b2f"))
    assert flag_changes(saved, _ns()) == []  # ignored without --use-tcod
    assert flag_changes({**saved, "use_tcod": True}, _ns(use_tcod=True, tcod_eta=2)) == [
        "--tcod-mode b2f -> f2b", "--tcod-eta unset -> 2"]
    assert flag_changes(saved, _ns(use_tcod=True)) == ["--use-tcod off -> on"]
    assert flag_changes({"max_turns": 4}, _ns(max_turns=8)) == ["--max-turns 4 -> 8"]  # from a YAML too
    assert flag_changes({}, _ns()) == []  # a flag an older runtime did not save is not compared


def test_model_shape_is_read_from_text_config_and_skipped_where_the_model_is_absent(setup):
    args = Namespace(hf_checkpoint=setup["student"])
    assert model_changes({"text_config": {"hidden_size": 16, "vocab_size": 100}}, args) == [
        f"the model (--hf-checkpoint {setup['student']}) is another architecture than the checkpoint's: "
        "hidden_size 16 -> 32"]
    assert model_changes({"hidden_size": 16}, Namespace(hf_checkpoint=str(setup["root"] / "elsewhere"))) == []


# ---------------------------------------------------------------------------- the trainer's side
def test_override_sets_the_restored_optimizers_lr_and_the_logged_lr(setup, tmp_path):
    from slime.backends.fsdp_utils.actor import FSDPActor

    with single_thread():
        first = FSDPActor(make_args(setup["student"]), 0, 1)
        first.train(0, make_samples(seed=0), kl_coef=0.0)
        first.save(str(tmp_path / "model"))
        kept = FSDPActor(make_args(setup["student"], "--lr", "5e-4"), 0, 1)
        kept.load(str(tmp_path / "model"))
        assert kept.train(1, make_samples(seed=1), kl_coef=0.0)["lr"] == 1e-3  # the restored state wins
        new = FSDPActor(make_args(setup["student"], "--lr", "5e-4", "--override-opt_param-scheduler"), 0, 1)
        new.load(str(tmp_path / "model"))
        assert new.train(1, make_samples(seed=1), kl_coef=0.0)["lr"] == 5e-4


def test_train_py_resumed_with_override_logs_the_new_lr(setup):
    """The whole path: train.py saves at lr 1e-3, resumes with --lr 5e-4 and the flag, logs 5e-4 (SFT on the
    expert trajectories: Ray and the trainer, no engine)."""
    import ray

    from slime.utils.metrics import read_metrics

    out = setup["root"] / "sft"
    argv = ["--hf-checkpoint", setup["student"], "--prompt-data", setup["base"][3],
            "--rollout-interaction-env-path", "examples.agent_envs", "--max-turns", "4", "--max-turn-response-len",
            "6", "--rollout-max-response-len", "200", "--loss-type", "sft_loss", "--rollout-function-path",
            "slime.rollout.sft_rollout.generate_rollout", "--rollout-batch-size", "2", "--save", str(out),
            "--save-interval", "1", "--load", str(out)]
    try:
        assert train.main([*argv, "--num-rollout", "1", "--lr", "1e-3"]) == 0
        assert train.main([*argv, "--num-rollout", "2", "--lr", "5e-4", "--override-opt_param-scheduler"]) == 0
    finally:
        ray.shutdown()
    assert [(r["step"], r["lr"]) for r in read_metrics(out / "metrics.jsonl")] == [(0, 1e-3), (1, 5e-4)]
