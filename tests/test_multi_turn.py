"""The agent loop against a real hf_engine: token layout invariants, TCOD plans, env faults."""

import asyncio
import copy

import pytest
import torch

from _engine_helpers import start_hf_engine
from examples.agent_envs import make_env
from slime.ray.rollout import TooManyFailures, select_trainable
from examples.multi_turn_tcod.chat_layout import decode_action, encode_observation
from slime.rollout import teacher_prefix
from examples.multi_turn_tcod.rollout import generate
from slime.rollout.on_policy_distillation import teacher_payload
from slime.rollout.sglang_rollout import build_sampling_params, run_async, sampling_seed
from slime.rollout.tcod import episode_plan
from slime.utils.arguments import get_parser, validate_args
from slime.utils.http_utils import close_session
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint
from slime.utils.types import Sample, Status

ENV_PATH = "examples.agent_envs.make_env"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("policy"), hidden_size=32, num_layers=2, num_heads=2, seed=3)
    server, runner = start_hf_engine(path)
    yield server, runner, str(path)
    run_async(close_session())
    server.stop()


def make_args(engine, *extra):
    server, _, path = engine
    if "--use-tcod" in extra:
        extra = ("--rollout-function-path", "slime.rollout.tcod.generate_rollout", *extra)
    args = get_parser().parse_args([
        "--hf-checkpoint", path, "--max-turns", "6", "--rollout-interaction-env-path", ENV_PATH,
        "--rollout-max-response-len", "260", "--max-turn-response-len", "8", "--rollout-seed", "5", *extra])
    validate_args(args)
    args.rollout_engine_urls = [server.url]
    return args


def task(i, env="gridnav", **meta):
    return Sample(index=i, group_index=i, metadata={"env": env, "seed": i, **meta})


def play(args, samples, rollout_id=0, evaluation=False):
    for s in samples:
        plan = episode_plan(args, rollout_id, evaluation)
        s.metadata["episode_plan"] = plan

    async def run_all():
        params = build_sampling_params(args, evaluation)
        return await asyncio.gather(*(generate(args, s, {**params, "sampling_seed": sampling_seed(args, s, evaluation)},
                                               evaluation) for s in samples))

    return run_async(run_all())


def rescore(runner, tokens, temperature):
    with torch.no_grad():
        logits = runner.model(torch.tensor([tokens])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return [logp[i - 1, tokens[i]].item() for i in range(1, len(tokens))]


def replay_observations(args, sample, actions):
    env = make_env(args, sample)
    env.reset()
    observations = []
    for action in actions:
        observations.append(env.step(action)[0])
    env.close()
    return observations


def test_layout_invariants_on_many_trajectories(engine):
    args = make_args(engine)
    tok = build_tokenizer()
    samples = play(args, [task(i) for i in range(12)] + [task(100 + i, env="hanoi") for i in range(4)])
    for s in samples:
        s.validate()
        prompt_len = len(s.tokens) - s.response_length
        spans = s.metadata["turn_spans"]
        assert s.metadata["num_turns"] == len(spans) >= 1
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        trainable = {t for a, b in spans for t in range(a, b)}
        assert {t for t, m in enumerate(s.loss_mask) if m} == trainable
        # Every masked token is an observation: replaying the decoded actions reproduces them exactly.
        response = s.tokens[prompt_len:]
        actions = [decode_action(tok, response[a:b]) for a, b in spans]
        observations = replay_observations(args, s, actions)
        for j, (a, b) in enumerate(spans[:-1]):
            gap = response[b:spans[j + 1][0]]
            assert gap == encode_observation(tok, observations[j])
        tail = response[spans[-1][1]:]
        if s.metadata["outcome"] != "context_full":
            assert tail == []  # done, cut or out of turns: nothing follows the last student turn
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
    args = make_args(engine, "--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
                     "--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "2")
    for rollout_id, depth in ((0, 1), (3, 2), (5, 3)):
        samples = play(args, [task(i) for i in range(6)], rollout_id=rollout_id)
        for s in samples:
            assert s.metadata["episode_plan"]["depth"] == depth
            assert len(s.metadata["turn_spans"]) <= depth
            last_trainable = max(t for t, m in enumerate(s.loss_mask) if m)
            assert last_trainable < s.metadata["turn_spans"][depth - 1][1] if len(s.metadata["turn_spans"]) == depth \
                else True
            if s.metadata["outcome"] == "cut":
                assert s.status == Status.COMPLETED and len(s.metadata["turn_spans"]) == depth
    # Evaluation plays full episodes whatever the step.
    full = play(args, [task(i) for i in range(3)], rollout_id=0, evaluation=True)
    assert all(s.metadata["episode_plan"]["mode"] == "full" for s in full)


def test_b2f_prefix_is_replayed_in_the_prompt(engine):
    args = make_args(engine, "--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
                     "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "1")
    tok = build_tokenizer()
    probe = [task(i, min_dist=4) for i in range(5)]
    expert = {}
    for s in probe:
        env = make_env(args, s)
        env.reset()
        expert[s.index] = env.expert_actions()
        env.close()
    samples = play(args, copy.deepcopy(probe), rollout_id=1)  # depth 2
    for s in samples:
        prefix = max(0, len(expert[s.index]) - 2)
        assert s.metadata["prefix_turns"] == prefix
        prompt_text = tok.decode(s.tokens[: len(s.tokens) - s.response_length])
        for action in expert[s.index][:prefix]:
            assert f"{action}<|im_end|>" in prompt_text
        # Nothing in the prefix is trainable: the response (and so the loss mask) starts after it.
        assert s.response_length > 0 and s.loss_mask[0] == 1


def test_b2f_replay_that_finishes_yields_no_training_sample(engine):
    args = make_args(engine, "--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
                     "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "100")
    s = task(7)
    env = make_env(args, s)
    env.reset()
    path = env.expert_actions()
    env.close()
    s.metadata["expert_actions"] = path + ["up"]  # one extra action: the replay of L - 1 already solves it
    [out] = play(args, [s])
    assert out.metadata["outcome"] == "replay_finished" and out.remove_sample
    # Upstream's trainer sees one masked filler token, never an empty response.
    assert out.response_length == 1 and out.loss_mask == [0]
    kept, stats = select_trainable(args, [[out]])
    assert kept == [] and stats["rollout/dropped"] == 1


def test_teacher_prefix_source(engine):
    args = make_args(engine, "--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
                     "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "1", "--tcod-prefix-source", "teacher")
    teacher_prefix.CACHE.clear()
    samples = play(args, [task(i, min_dist=4) for i in range(3)], rollout_id=0)
    # One teacher episode per task, on the real gridnav env; an untrained teacher mostly fails them, and
    # a failed task falls back to a full student episode (tests/test_teacher_prefix.py has the rest).
    assert len(teacher_prefix.CACHE.entries) == 3
    for s in samples:
        assert s.metadata["episode_plan"]["prefix_source"] == "teacher" and s.metadata["teacher_episode_played"]
        if s.metadata.get("prefix_fallback"):
            assert s.metadata["prefix_turns"] == 0 and "prefix_source" not in s.metadata
        else:
            assert s.metadata["prefix_source"] in ("teacher_cached", "teacher_live")
    teacher_prefix.CACHE.clear()


def test_env_faults_fail_only_their_episode(engine):
    args = make_args(engine, "--rollout-interaction-env-path", "flaky_env.make_env")
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
    """A data source handing out groups of one task each (what tcod.generate_rollout wraps)."""

    def __init__(self, n):
        self.next = 0
        self.n = n

    def get_samples(self, num):
        groups = [[task(self.next + i)] for i in range(num)]
        self.next += num
        return groups


def test_tcod_rollout_function_attaches_the_step_plan_through_the_data_source(engine):
    from slime.rollout import tcod

    args = make_args(engine, "--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
                     "--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "2", "--rollout-batch-size", "3",
                     "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate")
    for step, depth in ((0, 1), (5, 3)):
        groups = tcod.generate_rollout(args, step, _Tasks(3))
        samples = [s for g in groups for s in g]
        assert len(samples) == 3
        assert all(s.metadata["episode_plan"]["depth"] == depth for s in samples)
        assert all(s.metadata["num_turns"] <= depth for s in samples)
        assert all(s.rollout_id is None for s in samples)  # upstream's field, not the training step
    # Evaluation passes through untouched: full episodes.
    [[evaluated]] = tcod.generate_rollout(args, 5, [[task(9)]], evaluation=True)
    assert "episode_plan" not in evaluated.metadata and evaluated.metadata["outcome"] != "cut"


def test_use_tcod_without_a_plan_fails_instead_of_playing_full_episodes(engine):
    args = make_args(engine, "--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
                     "--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "2")

    async def one():
        return await generate(args, task(0), build_sampling_params(args))

    with pytest.raises(ValueError, match="slime.rollout.tcod.generate_rollout"):
        run_async(one())


def test_reward_is_left_to_the_reward_model_and_the_return_kept(engine):
    # Upstream's generate_and_rm calls the reward model only when sample.reward is None.
    opd = ["--use-opd", "--opd-type", "sglang", "--rm-url", engine[0].url + "/generate",
           "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func"]
    trained = play(make_args(engine, *opd), [task(i) for i in range(3)])
    assert all(s.reward is None and isinstance(s.metadata["task_reward"], float) for s in trained)
    evaluated = play(make_args(engine, *opd), [task(i) for i in range(3)], evaluation=True)
    assert all(s.reward == s.metadata["task_reward"] for s in evaluated)
    plain = play(make_args(engine), [task(i) for i in range(3)])
    assert all(s.reward == s.metadata["task_reward"] for s in plain)


def test_removed_samples_never_reach_the_teacher(engine):
    from argparse import Namespace

    from slime.rollout import on_policy_distillation as opd

    args = make_args(engine, "--rollout-interaction-env-path", "flaky_env.make_env")
    [failed, ok] = play(args, [task(0, fail_at=0), task(1)])
    assert failed.remove_sample and failed.status == Status.FAILED and failed.response_length >= 1
    assert failed.loss_mask == [0] * failed.response_length
    teacher = Namespace(rm_url=f"http://127.0.0.1:1/generate", rollout_temperature=1.0)  # nothing listens there
    replies = run_async(opd.reward_func(teacher, [failed]))
    assert replies == [opd.SKIPPED_REPLY]
    opd.post_process_rewards(teacher, [failed])
    assert len(failed.teacher_log_probs) == failed.response_length
    assert not ok.remove_sample
