"""B2F with ``--tcod-prefix-source teacher``: the teacher's own episode defines the prefix, without expert
data. The environment (``scripted_env``) ends after a fixed number of steps whatever the actions, so an
untrained tiny teacher has a known episode length ``L``; the teacher server is the tiny engine itself.
Every episode goes through ``slime.rollout.teacher_prefix.generate``, the example's ``play_episode`` with
the teacher's prefix source."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest
import scripted_env
from _engine_helpers import ThreadedApp, start_hf_engine
from aiohttp import web
from test_checkpoint_integrity import StubData, StubTrainer

from examples.multi_turn_tcod.chat_layout import encode_observation
from slime.arguments.multi_turn_arguments import TEACHER_PREFIX_GENERATE
from slime.backends.sglang_utils.router import point_router_at_engines
from slime.checkpoint.driver import TEACHER_EPISODES, load_checkpoint, save_checkpoint
from slime.launch.checks import check_launch
from slime.rollout import sample_hooks, teacher_prefix
from slime.rollout.sglang_rollout import GenerateState, build_sampling_params, run_async, sampling_seed
from slime.utils.arguments import ArgumentError, get_parser, validate_args
from slime.utils.http_utils import close_session
from slime.utils.misc import load_function
from slime.utils.step_metrics import rollout_metrics
from slime.utils.tiny_models import save_tiny_checkpoint
from slime.utils.types import Sample

CACHE = teacher_prefix.CACHE
TCOD = ["--use-opd", "--opd-type", "sglang", "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "1"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("policy"), hidden_size=32, num_layers=2, num_heads=2, seed=3)
    server, runner = start_hf_engine(path)
    yield server, str(path)
    run_async(close_session())
    server.stop()


@pytest.fixture(autouse=True)
def empty_cache():
    CACHE.clear()
    yield
    CACHE.clear()


def make_args(engine, source="teacher", seed=5, env="scripted_env", teacher_url=None):
    server, path = engine
    args = get_parser().parse_args([
        "--hf-checkpoint", path, "--max-turns", "6", "--rollout-interaction-env-path", env,
        "--rollout-max-response-len", "300", "--max-turn-response-len", "6", "--rollout-seed", str(seed),
        "--rm-url", (teacher_url or server.url) + "/generate", *TCOD, "--tcod-prefix-source", source])
    validate_args(args)
    point_router_at_engines(args, [server.url])
    return args


def task(i, length=5, **meta):
    return Sample(index=i, group_index=i, prompt="", metadata={"length": length, **meta})


def play(args, samples, step):
    sample_hooks.set_current_rollout_id(step)  # what RolloutManager.generate does
    fn = load_function(args.custom_generate_function_path or "examples.multi_turn_tcod.rollout.generate")

    async def run_all():
        params = build_sampling_params(args)
        return await asyncio.gather(*(fn(args, s, {**params, "sampling_seed": sampling_seed(args, s, False)})
                                      for s in samples))

    return run_async(run_all())


def prompt_part(s):
    return s.tokens[: len(s.tokens) - s.response_length]


def prefix_part(s):
    """The masked response before the student's first turn: where a B2F prefix goes."""
    spans = s.metadata["turn_spans"]
    response = s.tokens[len(s.tokens) - s.response_length:]
    return response[: spans[0][0]] if spans else response


def metrics(args, samples):
    return rollout_metrics(args, [samples], samples, {})


def test_teacher_source_selects_its_generate_function(engine, tmp_path):
    args = make_args(engine)
    assert args.custom_generate_function_path == TEACHER_PREFIX_GENERATE
    assert load_function(args.custom_generate_function_path) is teacher_prefix.generate
    server, path = engine
    base = ["--hf-checkpoint", path, "--max-turns", "6", "--rollout-interaction-env-path", "scripted_env",
            "--rm-url", server.url + "/generate", *TCOD, "--tcod-prefix-source", "teacher"]
    # The example's agent loop named explicitly is replaced the same way; another generate is refused.
    named = validate_args(get_parser().parse_args(
        [*base, "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate"]))
    assert named.custom_generate_function_path == TEACHER_PREFIX_GENERATE
    with pytest.raises(ArgumentError, match="would ignore it") as err:
        validate_args(get_parser().parse_args([*base, "--custom-generate-function-path", "my.pkg.generate"]))
    assert "\n" not in str(err.value)
    # The plan says so, since no flag on the command line names it.
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"input": "", "metadata": {"length": 3}}) + "\n")
    notes = check_launch(validate_args(get_parser().parse_args([*base, "--num-rollout", "1", "--prompt-data",
                                                                str(data)])))
    assert any(TEACHER_PREFIX_GENERATE in n for n in notes)


def test_prefix_shrinks_as_k_grows_without_expert_actions(engine):
    args = make_args(engine)
    seen = {}
    for step in (0, 2, 4, 5):  # depth 1, 3, 5, 6 against a teacher episode of L = 5
        samples = play(args, [task(0), task(1, length=4)], step)
        m = metrics(args, samples)
        depth = step + 1
        assert [s.metadata["prefix_turns"] for s in samples] == [max(0, 5 - depth), max(0, 4 - depth)]
        seen[step] = m["tcod/prefix_len"]
        for s in samples:
            first = s.metadata["turn_spans"][0][0]
            # The prefix is masked, before the student's first turn; the student's turns are trained.
            assert not any(s.loss_mask[:first]) and s.loss_mask[first] == 1
            assert (first > 0) == (s.metadata["prefix_turns"] > 0)
            assert s.metadata["num_turns"] == s.metadata["length"] - s.metadata["prefix_turns"]
        assert m["tcod/prefix_source_teacher_cached"] == sum(s.metadata["prefix_turns"] > 0 for s in samples)
        assert m["tcod/prefix_fallback"] == 0
    assert seen[0] == 3.5 and seen[2] == 1.5 and seen[4] == 0.0 and seen[5] == 0.0


def test_replay_executes_the_recorded_teacher_turns(engine):
    args = make_args(engine)
    scripted_env.STEPPED.clear()
    [s] = play(args, [task(3)], step=1)  # depth 2: 3 replayed turns
    record = next(iter(CACHE.entries.values()))
    assert record["length"] == 5 and record["success"] and len(record["observations"]) == 5
    # The prompt is the student's own reset; the prefix the layout the teacher's turns make: its own token
    # ids (cut turns closed by <|im_end|>), each followed by the observation the student's env returned on
    # re-executing the action.
    tok = GenerateState(args).tokenizer
    assert prompt_part(s) == record["prompt_ids"]
    expected = []
    for i in range(3):
        expected += record["action_ids"][i] + encode_observation(tok, json.loads(record["observations"][i]))
    assert prefix_part(s) == expected
    assert all(ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") for ids in record["action_ids"])
    # Teacher episode: 5 steps in its own env; then the student's env re-executes the first 3 actions.
    replayed = [a for i, a in scripted_env.STEPPED if i == 3][5:8]
    assert replayed == record["actions"][:3]


def test_cache_hits_misses_and_keys(engine):
    args = make_args(engine)
    group = play(args, [task(10, length=4), task(11, length=4)], step=0)
    # Two samples of one task (one group): one teacher episode, then both replay it.
    assert sum(s.metadata["teacher_episode_played"] for s in group) == 1
    assert len(CACHE.entries) == 1 and metrics(args, group)["tcod/teacher_episodes"] == 1
    again = play(args, [task(12, length=4)], step=1)
    assert again[0].metadata["teacher_episode_played"] is False and len(CACHE.entries) == 1
    # Keys: the index and the plan are not the task; the task's metadata and --rollout-seed are.
    a, b = task(1, length=4), task(2, length=4)
    b.metadata["episode_plan"] = {"mode": "b2f"}
    assert teacher_prefix.task_key(args, a) == teacher_prefix.task_key(args, b)
    assert teacher_prefix.task_key(args, a) != teacher_prefix.task_key(args, task(1, length=5))
    other_seed = make_args(engine, seed=6)
    assert teacher_prefix.task_key(args, a) != teacher_prefix.task_key(other_seed, a)
    [fresh] = play(other_seed, [task(13, length=4)], step=0)
    assert fresh.metadata["teacher_episode_played"] is True and len(CACHE.entries) == 2
    # At full depth (k = --max-turns) every prefix is empty: no teacher episode is played at all.
    [full] = play(args, [task(14, length=2)], step=5)
    assert "teacher_episode_played" not in full.metadata and len(CACHE.entries) == 2


def test_resume_restores_the_cache_and_replays_exactly(engine, tmp_path, monkeypatch):
    args = make_args(engine)
    play(args, [task(0), task(1, length=3)], step=0)
    uninterrupted = play(args, [task(0), task(1, length=3)], step=1)
    saved = CACHE.state_dict()
    save_checkpoint(tmp_path, 0, trainer=StubTrainer(), data_source=StubData(), kl_controller=None,
                    teacher_episodes=CACHE)
    assert os.path.exists(tmp_path / "iter_0000000" / TEACHER_EPISODES)

    CACHE.clear()  # a new process

    async def teacher_asked(*_):
        raise AssertionError("the resumed run asked the teacher for an episode it had recorded")

    # The resumed run must not need the teacher for the tasks it recorded (nor could it draw the same).
    monkeypatch.setattr(teacher_prefix, "play_teacher_episode", teacher_asked)
    with pytest.raises(AssertionError):
        play(args, [task(0)], step=1)
    load_checkpoint(tmp_path, trainer=StubTrainer(), data_source=StubData(), kl_controller=None,
                    teacher_episodes=CACHE)
    assert CACHE.state_dict() == saved
    resumed = play(args, [task(0), task(1, length=3)], step=1)
    assert [s.tokens for s in resumed] == [s.tokens for s in uninterrupted]
    assert [s.loss_mask for s in resumed] == [s.loss_mask for s in uninterrupted]


def test_a_cache_of_the_old_layout_is_played_again(caplog):
    with caplog.at_level(logging.WARNING, logger="slime.rollout.teacher_prefix"):
        CACHE.load_state_dict({"version": 1, "entries": {"seed5:x": {"actions": ["a"]}}})
    assert CACHE.entries == {} and any("older version" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="unknown version 99"):
        CACHE.load_state_dict({"version": 99, "entries": {}})


def test_failed_teacher_episode_falls_back_to_vanilla(engine):
    args = make_args(engine)
    samples = play(args, [task(0, length=4, succeed=False), task(1, length=4)], step=0)
    failed, ok = samples
    assert failed.metadata["prefix_turns"] == 0 and failed.metadata["prefix_fallback"] is True
    assert failed.metadata["num_turns"] == 4  # the student plays the whole episode
    assert "prefix_source" not in failed.metadata
    assert ok.metadata["prefix_turns"] == 3 and not ok.metadata.get("prefix_fallback")
    m = metrics(args, samples)
    assert m["tcod/prefix_fallback"] == 1 and m["tcod/prefix_source_teacher_cached"] == 1
    # The failure is cached: the frozen teacher is not asked again.
    [again] = play(args, [task(2, length=4, succeed=False)], step=1)
    assert again.metadata["teacher_episode_played"] is False and again.metadata["prefix_fallback"]


def test_expert_source_without_expert_actions_plays_in_full(engine):
    args = make_args(engine, source="expert")
    assert args.custom_generate_function_path is None  # the example's agent loop, as slime.launch.checks defaults
    samples = play(args, [task(0), task(1)], step=0)
    assert all(s.metadata["prefix_turns"] == 0 and s.metadata["num_turns"] == 5 for s in samples)
    assert not CACHE.entries


@pytest.mark.parametrize("noisy_from", [0, 2])
def test_environment_that_does_not_replay_gets_a_live_prefix(engine, noisy_from):
    args = make_args(engine)
    [s] = play(args, [task(0, length=5, noisy_from=noisy_from)], step=0)  # depth 1: 4 prefix turns
    record = next(iter(CACHE.entries.values()))
    assert record["replayable"] is False
    assert s.metadata["prefix_source"] == "teacher_live" and s.metadata["prefix_turns"] == 4
    assert not any(s.loss_mask[: s.metadata["turn_spans"][0][0]])  # a live prefix is masked all the same
    m = metrics(args, [s])
    assert m["tcod/prefix_source_teacher_live"] == 1 and m["tcod/prefix_source_teacher_cached"] == 0
    # Later steps go live from the start, without a new teacher episode.
    [t] = play(args, [task(1, length=5, noisy_from=noisy_from)], step=2)
    assert t.metadata["prefix_source"] == "teacher_live" and t.metadata["prefix_turns"] == 2
    assert t.metadata["teacher_episode_played"] is False


def test_an_aborted_teacher_turn_aborts_the_episode_and_caches_nothing(engine):
    async def aborted(request):
        return web.json_response({"text": "", "meta_info": {"finish_reason": {"type": "abort"},
                                                            "output_token_logprobs": []}})

    app = web.Application()
    app.router.add_post("/generate", aborted)
    teacher = ThreadedApp(app)
    try:
        args = make_args(engine, teacher_url=teacher.url)
        [s] = play(args, [task(0)], step=0)
    finally:
        run_async(close_session())
        teacher.stop()
    assert s.status == Sample.Status.ABORTED and s.metadata["outcome"] == "aborted" and s.remove_sample
    assert not CACHE.entries  # an abort is the run's, not the task's: the teacher plays it again later


def test_in_trainer_teacher_is_refused_clearly(engine):
    server, path = engine
    args = get_parser().parse_args([
        "--hf-checkpoint", path, "--max-turns", "6", "--rollout-interaction-env-path", "scripted_env",
        "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", path,
        "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "1", "--tcod-prefix-source", "teacher"])
    with pytest.raises(ValueError, match="in-trainer teacher"):
        validate_args(args)
