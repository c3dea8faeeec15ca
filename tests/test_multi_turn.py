"""The agent loop against a real hf_engine: token layout invariants, TCOD plans, env faults, aborts."""

import asyncio
import copy

import pytest
import torch
from aiohttp import web

from _engine_helpers import ThreadedApp, start_hf_engine
from examples.agent_envs import build_env
from examples.multi_turn_tcod.chat_layout import encode_action, encode_observation, turn_stop_id
from examples.multi_turn_tcod.rollout import generate
from slime.backends.sglang_utils.router import point_router_at_engines
from slime.ray.rollout import RolloutManager
from slime.rollout import sample_hooks, sglang_rollout, teacher_prefix
from slime.rollout.on_policy_distillation import teacher_payload
from slime.rollout.sglang_rollout import build_sampling_params, run_async, sampling_seed
from slime.rollout.trainable_samples import TooManyFailures, select_trainable
from slime.utils.arguments import get_parser, validate_args
from slime.utils.http_utils import close_session
from slime.utils.misc import load_function
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint
from slime.utils.types import Sample, Status

ENV_PATH = "examples.agent_envs"
OPD = ("--use-opd", "--opd-type", "sglang")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("policy"), hidden_size=32, num_layers=2, num_heads=2, seed=3)
    server, runner = start_hf_engine(path)
    yield server, runner, str(path)
    run_async(close_session())
    server.stop()


def make_args(engine, *extra):
    server, _, path = engine
    if "--use-opd" in extra and "megatron" not in extra:
        extra = (*extra, "--rm-url", server.url + "/generate")
    args = get_parser().parse_args([
        "--hf-checkpoint", path, "--max-turns", "6", "--rollout-interaction-env-path", ENV_PATH,
        "--rollout-max-response-len", "260", "--max-turn-response-len", "8", "--rollout-seed", "5", *extra])
    validate_args(args)
    point_router_at_engines(args, [server.url])  # what RolloutManager does for the one engine it starts
    return args


def task(i, env="gridnav", **meta):
    return Sample(index=i, group_index=i, metadata={"env": env, "seed": i, **meta})


def play(args, samples, rollout_id=0, evaluation=False):
    """The samples through the run's generate function, as the default rollout runs it at ``rollout_id``."""
    sample_hooks.set_current_rollout_id(rollout_id)  # what RolloutManager.generate does
    fn = load_function(args.custom_generate_function_path) if args.custom_generate_function_path else generate

    async def run_all():
        params = build_sampling_params(args, evaluation)
        return await asyncio.gather(*(fn(args, s, {**params, "sampling_seed": sampling_seed(args, s, evaluation)},
                                         evaluation) for s in samples))

    return run_async(run_all())


def rescore(runner, tokens, temperature):
    with torch.no_grad():
        logits = runner.model(torch.tensor([tokens])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return [logp[i - 1, tokens[i]].item() for i in range(1, len(tokens))]


def replay_messages(args, sample, actions):
    """The chat messages the env shows after each action, replayed in a fresh env."""
    env = build_env(sample, args)
    env.reset()
    messages = [env.format_observation(env.step(action)[0]) for action in actions]
    env.close()
    return messages


def expert_path(args, sample):
    env = build_env(sample, args)
    env.reset()
    path = env.expert_actions()
    env.close()
    return path


def test_layout_invariants_on_many_trajectories(engine):
    args = make_args(engine)
    tok = build_tokenizer()
    stop = turn_stop_id(tok)
    samples = play(args, [task(i) for i in range(12)] + [task(100 + i, env="hanoi") for i in range(4)])
    for s in samples:
        s.validate()
        prompt_len = len(s.tokens) - s.response_length
        spans = s.metadata["turn_spans"]
        assert s.metadata["num_turns"] == len(spans) >= 1
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        trainable = {t for a, b in spans for t in range(a, b)}
        assert {t for t, m in enumerate(s.loss_mask) if m} == trainable
        response = s.tokens[prompt_len:]
        # A turn cut by its budget is closed by a masked <|im_end|> before the next observation; the env got
        # its text without it. The last turn is left as sampled.
        cut = [response[b - 1] != stop for a, b in spans]
        assert sum(cut) == s.metadata["turns_without_stop"]
        actions = [tok.decode([t for t in response[a:b] if t != stop]) for a, b in spans]
        # Every other masked token is an observation: replaying the actions reproduces them exactly.
        messages = replay_messages(args, s, actions)
        for j, (a, b) in enumerate(spans[:-1]):
            gap = response[b:spans[j + 1][0]]
            assert gap == [stop] * cut[j] + encode_observation(tok, messages[j])
        tail = response[spans[-1][1]:]
        if s.metadata["outcome"] != "context_full":
            assert tail == []  # done or out of turns: nothing follows the last turn
        # Trainable log-probs are the policy's own at the rollout temperature.
        full = rescore(engine[1], s.tokens, args.rollout_temperature)
        for t in trainable:
            assert abs(full[prompt_len + t - 1] - s.rollout_log_probs[t]) < 1e-3
        # The teacher receives exactly the sequence the student produced.
        assert teacher_payload(args, s)["input_ids"] == s.tokens
        assert s.metadata["outcome"] in ("done", "max_turns", "context_full")


def test_seeded_rollouts_are_reproducible(engine):
    args = make_args(engine)
    a = play(args, [task(i) for i in range(4)])
    b = play(args, [task(i) for i in range(4)])
    assert [s.tokens for s in a] == [s.tokens for s in b]


def test_f2b_cuts_after_depth(engine):
    args = make_args(engine, *OPD, "--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "2")
    for rollout_id, depth in ((0, 1), (3, 2), (5, 3)):
        samples = play(args, [task(i) for i in range(6)], rollout_id=rollout_id)
        for s in samples:
            assert s.metadata["episode_plan"]["depth"] == depth and s.metadata["episode_plan"]["step"] == rollout_id
            assert len(s.metadata["turn_spans"]) <= depth
            if s.metadata["outcome"] == "cut":
                assert s.status == Status.COMPLETED and len(s.metadata["turn_spans"]) == depth
                last_trainable = max(t for t, m in enumerate(s.loss_mask) if m)
                assert last_trainable < s.metadata["turn_spans"][depth - 1][1]
    # Evaluation plays full episodes whatever the step.
    full = play(args, [task(i) for i in range(3)], rollout_id=0, evaluation=True)
    assert all(s.metadata["episode_plan"]["mode"] == "full" for s in full)


def test_b2f_prefix_is_replayed_masked_before_the_students_turns(engine):
    args = make_args(engine, *OPD, "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "1")
    tok = build_tokenizer()
    probe = [task(i, min_dist=4) for i in range(5)]
    expert = {s.index: expert_path(args, s) for s in probe}
    samples = play(args, copy.deepcopy(probe), rollout_id=1)  # depth 2
    for s in samples:
        prefix = max(0, len(expert[s.index]) - 2)
        assert s.metadata["prefix_turns"] == prefix
        response = s.tokens[len(s.tokens) - s.response_length:]
        first = s.metadata["turn_spans"][0][0]
        # Nothing before the student's first turn is trainable: the replayed actions and their observations.
        assert not any(s.loss_mask[:first]) and s.loss_mask[first] == 1
        assert (first > 0) == (prefix > 0)
        replayed = tok.decode(response[:first])
        for action in expert[s.index][:prefix]:
            assert f"{action}<|im_end|>" in replayed
        if prefix:  # the response opens with the first expert action, encoded as an expert SFT turn is
            head = encode_action(tok, expert[s.index][0])
            assert response[:len(head)] == head


def test_b2f_replay_that_finishes_yields_no_training_sample(engine):
    args = make_args(engine, *OPD, "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "100")
    s = task(7)
    s.metadata["expert_actions"] = expert_path(args, s) + ["up"]  # one extra: the replay of L - 1 already solves it
    [out] = play(args, [s])
    assert out.metadata["outcome"] == "replay_finished" and out.remove_sample
    # Upstream's trainer sees a response of masked tokens only, never an empty one.
    assert out.response_length > 0 and not any(out.loss_mask) and out.metadata["num_turns"] == 0
    kept, stats = select_trainable(args, [[out]])
    assert kept == [] and stats["rollout/dropped"] == 1


def test_teacher_prefix_source_runs_through_its_generate(engine):
    args = make_args(engine, *OPD, "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "1",
                     "--tcod-prefix-source", "teacher")
    assert args.custom_generate_function_path == "slime.rollout.teacher_prefix.generate"
    teacher_prefix.CACHE.clear()
    samples = play(args, [task(i, min_dist=4) for i in range(3)], rollout_id=0)
    # One teacher episode per task, on the real gridnav env; an untrained teacher mostly fails them, and
    # a failed task falls back to a full student episode (tests/test_teacher_prefix.py has the rest).
    assert len(teacher_prefix.CACHE.entries) == 3
    for s in samples:
        assert s.metadata["episode_plan"]["mode"] == "b2f" and s.metadata["teacher_episode_played"]
        if s.metadata.get("prefix_fallback"):
            assert s.metadata["prefix_turns"] == 0 and "prefix_source" not in s.metadata
        else:
            assert s.metadata["prefix_source"] in ("teacher_cached", "teacher_live")
    teacher_prefix.CACHE.clear()


def test_env_faults_fail_only_their_episode(engine):
    args = make_args(engine, "--rollout-interaction-env-path", "flaky_env")
    samples = play(args, [task(0, fail_at=2), task(1, fail_at=0), task(2), task(3)])
    assert [s.status == Status.FAILED for s in samples] == [True, True, False, False]
    assert "simulated crash at step 2" in samples[0].metadata["error"]
    assert "JVM crashed" in samples[1].metadata["error"]
    kept, stats = select_trainable(args, [[s] for s in samples])
    assert [s.index for s in kept] == [2, 3] and stats["rollout/failed"] == 2
    worse = play(args, [task(0, fail_at=1), task(1, fail_at=1), task(2, fail_at=0), task(3)])
    with pytest.raises(TooManyFailures, match="3 of 4 samples failed"):
        select_trainable(args, [[s] for s in worse])


def test_turns_cut_before_their_stop_token_are_counted_and_warned(engine, caplog):
    import slime.utils.step_metrics as step_metrics

    # A random policy almost never emits <|im_end|> within 3 tokens: nearly every turn is cut.
    args = make_args(engine, "--max-turn-response-len", "3", "--max-turns", "3")
    samples = play(args, [task(i) for i in range(4)])
    stop = engine[1].tokenizer.convert_tokens_to_ids("<|im_end|>")
    cut = sum(1 for s in samples for a, b in s.metadata["turn_spans"]
              if stop not in s.tokens[len(s.tokens) - s.response_length:][a:b])
    assert sum(s.metadata["turns_without_stop"] for s in samples) == cut > 0
    turns = sum(s.metadata["num_turns"] for s in samples)
    step_metrics._warned_cut_turns = False
    with caplog.at_level("WARNING", logger="slime.utils.step_metrics"):
        for _ in range(2):
            metrics = step_metrics.rollout_metrics(args, [samples], samples, {})
    assert metrics["multi_turn/turns_without_stop"] == pytest.approx(cut / turns)
    warnings = [r for r in caplog.records if "--max-turn-response-len 3" in r.getMessage()]
    assert len(warnings) == 1  # once per process, not once per step
    # A few rambling turns among many stopped ones stay below the warning threshold.
    for s in samples:
        s.metadata["turns_without_stop"] = 0
    samples[0].metadata["turns_without_stop"] = 1
    assert step_metrics.turns_without_stop_fraction(samples) == pytest.approx(1 / turns)


class _Tasks:
    """A data source handing out groups of one task each."""

    def __init__(self, n):
        self.next = 0
        self.n = n

    def get_samples(self, num):
        groups = [[task(self.next + i)] for i in range(num)]
        self.next += num
        return groups


def test_the_manager_gives_the_agent_loop_its_step_without_a_rollout_function(engine):
    args = make_args(engine, *OPD, "--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "2", "--rollout-batch-size", "3",
                     "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate")
    assert args.rollout_function_path == "slime.rollout.sglang_rollout.generate_rollout"  # upstream's default
    manager = RolloutManager.__new__(RolloutManager)
    manager.args, manager.data_source = args, _Tasks(3)
    manager.engines = []  # none started by this manager (the fixture's engine serves it): nothing to watch
    manager.generate_rollout = sglang_rollout.generate_rollout
    for step, depth in ((0, 1), (5, 3)):
        samples, groups, stats = manager.generate(step)
        flat = [s for g in groups for s in g]
        assert len(flat) == 3 and sample_hooks.get_current_rollout_id() == step
        assert all(s.metadata["episode_plan"]["depth"] == depth for s in flat)
        assert all(s.metadata["num_turns"] <= depth for s in flat)
        assert all(s.rollout_id is None for s in flat)  # upstream's field, not the training step


def test_use_tcod_without_a_rollout_id_fails_instead_of_playing_full_episodes(engine):
    args = make_args(engine, *OPD, "--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "2")
    sample_hooks.set_current_rollout_id(None)

    async def one():
        return await generate(args, task(0), build_sampling_params(args))

    with pytest.raises(RuntimeError, match="set_current_rollout_id"):
        run_async(one())


def test_reward_is_left_to_the_reward_model_and_the_return_kept(engine):
    # Upstream's generate_and_rm calls the reward model only when sample.reward is None: in training with a
    # teacher server the loop leaves it so; with an in-trainer teacher there is none, and pure OPD trains 0.0.
    server = make_args(engine, *OPD, "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func")
    trained = play(server, [task(i) for i in range(3)])
    assert all(s.reward is None and isinstance(s.metadata["task_reward"], float) for s in trained)
    evaluated = play(server, [task(i) for i in range(3)], evaluation=True)
    assert all(s.reward == s.metadata["task_reward"] for s in evaluated)
    in_trainer = make_args(engine, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", engine[2])
    assert all(s.reward == 0.0 for s in play(in_trainer, [task(i) for i in range(2)]))
    plain = play(make_args(engine), [task(i) for i in range(3)])
    assert all(s.reward == s.metadata["task_reward"] for s in plain)


def test_removed_samples_never_reach_the_teacher(engine):
    from argparse import Namespace

    from slime.rollout import on_policy_distillation as opd

    args = make_args(engine, "--rollout-interaction-env-path", "flaky_env")
    [failed, ok] = play(args, [task(0, fail_at=0), task(1)])
    assert failed.remove_sample and failed.status == Status.FAILED and failed.response_length >= 1
    assert failed.loss_mask == [0] * failed.response_length
    teacher = Namespace(rm_url="http://127.0.0.1:1/generate", rollout_temperature=1.0)  # nothing listens there
    replies = run_async(opd.reward_func(teacher, [failed]))
    assert replies == [opd.SKIPPED_REPLY]
    opd.post_process_rewards(teacher, [failed])
    assert len(failed.teacher_log_probs) == failed.response_length
    assert not ok.remove_sample


# ---------------------------------------------------------------------------- aborts
@pytest.fixture
def aborting_engine():
    """Answers every /generate with SGLang's abort reply (what an engine sends for an aborted request)."""
    seen = []

    async def generate_route(request):
        seen.append(await request.json())
        return web.json_response({"text": "", "output_ids": [], "meta_info": {
            "finish_reason": {"type": "abort", "message": "aborted"}, "output_token_logprobs": []}})

    app = web.Application()
    app.router.add_post("/generate", generate_route)
    server = ThreadedApp(app)
    yield server, seen
    run_async(close_session())
    server.stop()


def test_episodes_the_engine_aborts_fail_and_are_not_scored(engine, aborting_engine):
    stub, seen = aborting_engine
    args = make_args(engine, *OPD, "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                     "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards",
                     "--rollout-batch-size", "4", "--custom-generate-function-path",
                     "examples.multi_turn_tcod.rollout.generate")
    point_router_at_engines(args, [stub.url])
    args.rm_url = "http://127.0.0.1:1/generate"  # the teacher must not be asked: nothing listens there
    groups = sglang_rollout.generate_rollout(args, 0, _Tasks(4))
    flat = [s for g in groups for s in g]
    # An abort the rollout did not ask for (GenerateState.aborted unset) is the engine failing the episode.
    assert len(seen) == 4 and all(s.status == Status.FAILED and s.metadata["outcome"] == "engine_abort" for s in flat)
    assert all(s.remove_sample and not any(s.loss_mask) for s in flat)
    assert all(s.metadata["error"] == "the engine aborted the request: aborted" for s in flat)
    with pytest.raises(TooManyFailures, match="4 of 4 samples failed.*the engine aborted the request"):
        select_trainable(args, groups)


def test_an_aborted_generate_state_ends_the_episode(engine, monkeypatch):
    args = make_args(engine)
    state = sglang_rollout.GenerateState(args)
    monkeypatch.setattr(state, "aborted", True)
    [s] = play(args, [task(0)])
    assert s.status == Status.ABORTED and s.metadata["outcome"] == "aborted" and s.metadata["num_turns"] == 0
