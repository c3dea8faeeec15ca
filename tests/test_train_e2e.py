"""train.py end to end on tiny models: multi-turn OPD with TCOD in both teacher modes, exact resume.

Every run goes through the real pieces: Ray trainer actors (FSDP2 over gloo), an hf_engine for rollouts,
the agent loop on the built-in gridnav environment, and a teacher either behind a second hf_engine
(``--opd-type sglang``) or loaded in the trainer (``--opd-type megatron``). Runs share one Ray instance.
"""

import json

import pytest

import train
from examples.agent_envs.make_data import task_rows
from slime.backends.sglang_utils.launcher import launch_engine
from slime.utils.arguments import get_parser
from slime.utils.metrics import read_metrics
from slime.utils.tiny_models import save_tiny_checkpoint

SERVER_TEACHER = ["--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                  "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    student = save_tiny_checkpoint(root / "student", hidden_size=32, num_layers=2, num_heads=2, seed=0)
    teacher = save_tiny_checkpoint(root / "teacher", hidden_size=32, num_layers=2, num_heads=2, seed=1)
    data = root / "tasks.jsonl"
    rows = task_rows("gridnav", 8, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=5)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = get_parser().parse_args(["--engine-host", "127.0.0.1"])
    server = launch_engine(args, model_path=str(teacher), log_dir=root / "logs")
    yield {"root": root, "student": str(student), "teacher": str(teacher), "data": str(data), "server": server}
    server.stop()
    import ray

    ray.shutdown()


def run(setup, name, *extra, steps=2, tcod=True):
    out = setup["root"] / name
    argv = ["--hf-checkpoint", setup["student"], "--prompt-data", str(setup["data"]),
            "--rollout-batch-size", "3", "--n-samples-per-prompt", "1", "--num-rollout", str(steps),
            "--rollout-max-response-len", "200", "--max-turn-response-len", "6", "--max-turns", "4",
            "--rollout-interaction-env-path", "examples.agent_envs",
            "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
            "--use-opd", "--lr", "1e-3", "--save", str(out), "--rollout-seed", "11", *extra]
    if tcod:
        argv += ["--use-tcod"]  # upstream's default rollout: the agent loop reads the step from sample_hooks
    assert train.main(argv) == 0
    return read_metrics(out / "metrics.jsonl")


def server_mode(setup):
    return ["--opd-type", "sglang", "--rm-url", setup["server"].url + "/generate", *SERVER_TEACHER]


@pytest.mark.parametrize("mode", ["server", "trainer"])
def test_vanilla_multi_turn_opd_logs_per_turn_kl(setup, mode):
    teacher = server_mode(setup) if mode == "server" else ["--opd-type", "megatron", "--opd-teacher-load",
                                                            setup["teacher"]]
    records = run(setup, f"vanilla_{mode}", *teacher, tcod=False)
    for r in records:
        assert "tcod/depth" not in r and r["tcod/prefix_len"] == 0  # full episodes from reset
        assert r["opd/reverse_kl"] != 0 and len(r["opd/per_turn_kl"]) >= 1
        assert r["rollout/trained_tokens"] > 0


def test_f2b_server_teacher(setup):
    # Two rollout engines: the agent loop reaches them through the sglang-router the run starts.
    records = run(setup, "f2b_server", *server_mode(setup), "--tcod-mode", "f2b", "--tcod-eta", "1",
                  "--rollout-num-gpus", "2")
    assert [r["tcod/depth"] for r in records] == [1, 2]
    assert all(r["multi_turn/turns"] <= r["tcod/depth"] for r in records)
    assert all(r["opd/reverse_kl"] != 0 for r in records)  # a different teacher disagrees
    assert all(isinstance(r["opd/per_turn_kl"], list) for r in records)


def test_turns_per_step_gives_f2b_at_depth_one_as_many_turns_as_vanilla_opd(setup):
    common = (*server_mode(setup), "--turns-per-step", "8")
    [f2b] = run(setup, "turns_f2b", *common, "--tcod-mode", "f2b", "--tcod-eta", "5", steps=1)
    [opd] = run(setup, "turns_opd", *common, steps=1, tcod=False)
    for record, cap in ((f2b, 1), (opd, 4)):  # at most one episode (of <= cap turns) past the 8 turns
        assert 8 <= record["rollout/student_turns"] < 8 + cap
        assert record["train/samples"] == record["rollout/kept"] == record["rollout/episodes"]
    assert f2b["tcod/depth"] == 1 and f2b["rollout/episodes"] == 8  # one turn each at depth 1
    assert opd["rollout/episodes"] < 8  # whole episodes: fewer of them for the same turns
    assert f2b["rollout/waves"] == 1 <= opd["rollout/waves"] <= opd["rollout/episodes"]  # cap 1: one wave of 8


def test_f2b_in_trainer_teacher(setup):
    records = run(setup, "f2b_trainer", "--opd-type", "megatron", "--opd-teacher-load", setup["teacher"],
                  "--tcod-mode", "f2b", "--tcod-eta", "1")
    assert [r["tcod/depth"] for r in records] == [1, 2]
    assert all(r["opd/reverse_kl"] != 0 for r in records)


def test_b2f_in_trainer_teacher_equal_to_student_has_zero_kl(setup):
    # slime's sanity check: a teacher identical to the student gives zero reverse KL before any update.
    records = run(setup, "b2f_self", "--opd-type", "megatron", "--opd-teacher-load", setup["student"],
                  "--tcod-mode", "b2f", "--tcod-eta", "1", steps=1)
    assert abs(records[0]["opd/reverse_kl"]) < 1e-5
    assert records[0]["tcod/depth"] == 1


def test_b2f_teacher_prefix_source(setup):
    # No expert actions anywhere: the teacher server plays each task once and its episode is the prefix.
    records = run(setup, "b2f_teacher", *server_mode(setup), "--tcod-mode", "b2f", "--tcod-eta", "1",
                  "--tcod-prefix-source", "teacher", "--rollout-interaction-env-path", "examples.agent_envs.no_expert",
                  steps=1)
    assert records[0]["tcod/depth"] == 1 and records[0]["tcod/teacher_episodes"] == 3
    assert records[0]["rollout/trained_tokens"] > 0


def test_sft_on_expert_trajectories_then_evaluation_through_the_agent_loop(setup):
    # The demo's first phase: SFT from the expert trajectories (no engine for training), evaluated by
    # playing full episodes with the agent loop on the run's engine.
    out = setup["root"] / "sft"
    argv = ["--hf-checkpoint", setup["student"], "--prompt-data", str(setup["data"]),
            "--rollout-interaction-env-path", "examples.agent_envs",
            "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
            "--max-turns", "4", "--max-turn-response-len", "6", "--rollout-max-response-len", "200",
            "--loss-type", "sft_loss", "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
            "--rollout-batch-size", "3", "--num-rollout", "1", "--lr", "1e-3", "--save", str(out),
            "--eval-prompt-data", "held", str(setup["data"]), "--eval-interval", "1", "--skip-eval-before-train"]
    assert train.main(argv) == 0
    [record] = read_metrics(out / "metrics.jsonl")
    assert record["rollout/trained_tokens"] > 0 and record["multi_turn/success_rate"] == 1.0  # the expert's
    assert 0.0 <= record["eval/held/success_rate"] <= 1.0


KEYS = ("loss", "opd/reverse_kl", "rollout/trained_tokens", "tcod/depth", "tcod/prefix_len", "grad_norm")


def test_b2f_server_teacher_resumes_exactly(setup):
    common = (*server_mode(setup), "--tcod-mode", "b2f", "--tcod-eta", "1", "--save-interval", "2")
    whole = run(setup, "b2f_whole", *common, steps=4)
    assert [r["tcod/depth"] for r in whole] == [1, 2, 3, 4]
    run(setup, "b2f_split", *common, steps=2)
    resumed = run(setup, "b2f_split", *common, "--load", str(setup["root"] / "b2f_split"), steps=4)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    for a, b in zip(whole[2:], resumed[2:]):
        for key in KEYS:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


# ---------------------------------------------------------------------------- --train-backend megatron
def megatron(tp):
    return ["--train-backend", "megatron", "--tensor-model-parallel-size", str(tp), "--actor-num-gpus-per-node", "2"]


@pytest.mark.parametrize("tcod_mode,teacher", [("f2b", "server"), ("f2b", "trainer"), ("b2f", "trainer")])
def test_megatron_backend_runs_tcod_in_both_teacher_modes(setup, tcod_mode, teacher):
    pytest.importorskip("megatron.core")
    mode = server_mode(setup) if teacher == "server" else ["--opd-type", "megatron", "--opd-teacher-load",
                                                            setup["teacher"]]
    tp = 2 if teacher == "trainer" else 1  # both layouts over two processes: TP 2, and DP 2
    records = run(setup, f"megatron_{tcod_mode}_{teacher}", *mode, *megatron(tp), "--tcod-mode", tcod_mode,
                  "--tcod-eta", "1")
    assert [r["tcod/depth"] for r in records] == [1, 2]
    assert all(r["opd/reverse_kl"] != 0 and r["rollout/trained_tokens"] > 0 for r in records)
    if tcod_mode == "b2f":
        assert records[0]["tcod/prefix_len"] > 0


def test_megatron_backend_resumes_exactly(setup):
    pytest.importorskip("megatron.core")
    common = (*server_mode(setup), *megatron(2), "--tcod-mode", "b2f", "--tcod-eta", "1", "--save-interval", "2")
    whole = run(setup, "megatron_whole", *common, steps=3)
    run(setup, "megatron_split", *common, steps=2)
    resumed = run(setup, "megatron_split", *common, "--load", str(setup["root"] / "megatron_split"), steps=3)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    for key in KEYS:
        assert whole[2][key] == pytest.approx(resumed[2][key], rel=1e-4, abs=1e-6), key
