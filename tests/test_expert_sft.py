"""Expert trajectories become SFT samples in exactly the agent loop's token layout."""

import json

import pytest

from examples.agent_envs import make_env
from examples.agent_envs import make_data
from examples.multi_turn_tcod import chat_layout
from slime.rollout.expert_sft import build_expert_sample, main as expert_sft_main
from slime.utils.tiny_models import build_tokenizer
from slime.utils.types import Sample


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def replay(metadata):
    """Observations the env returns along its expert path, gathered independently of expert_sft."""
    env = make_env(None, Sample(metadata=metadata))
    first = env.reset()
    actions = env.expert_actions()
    return first, actions, [env.step(a)[0] for a in actions]


TASKS = [dict(env="gridnav", seed=s, size=z, walls=w) for s, z, w in [(0, 3, 0.0), (1, 6, 0.2), (2, 10, 0.2)]] + \
        [dict(env="hanoi", seed=s, disks=d) for s, d in [(0, 1), (3, 3), (4, 5)]]


@pytest.mark.parametrize("metadata", TASKS)
@pytest.mark.parametrize("system", [None, "You are an agent."])
def test_layout_invariants(tok, metadata, system):
    first, actions, observations = replay(metadata)
    sample = build_expert_sample(make_env, None, Sample(index=7, metadata=dict(metadata)), tok, system=system)
    sample.validate()
    prompt_len = sample.prompt_length
    response = sample.tokens[prompt_len:]
    assert len(sample.tokens) == prompt_len + sample.response_length
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length == len(response)

    # The prompt is the chat template on the first observation, ending with the assistant header.
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": first}]
    expected_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(sample.tokens[:prompt_len], skip_special_tokens=False) == expected_prompt

    spans = sample.metadata["turn_spans"]
    assert sample.metadata["num_turns"] == len(spans) == len(actions)
    assert sample.metadata["success"] is True and sample.status == Sample.Status.COMPLETED
    assert len(sample.metadata["turn_rewards"]) == len(actions) and sample.reward == pytest.approx(1.0)
    stop = chat_layout.action_stop_token_id(tok)
    covered = set()
    for (start, end), action in zip(spans, actions):
        assert all(sample.loss_mask[start:end]) and response[end - 1] == stop
        assert tok.decode(response[start:end], skip_special_tokens=False) == action + "<|im_end|>"
        covered.update(range(start, end))
    # Every masked token lies between two turns and decodes to exactly that observation's wrapper.
    assert {i for i, m in enumerate(sample.loss_mask) if m} == covered
    gaps = [(spans[i][1], spans[i + 1][0]) for i in range(len(spans) - 1)]
    assert sum(b - a for a, b in gaps) == sample.loss_mask.count(0)
    for (a, b), obs in zip(gaps, observations):
        assert tok.decode(response[a:b], skip_special_tokens=False) == chat_layout.observation_text(obs)
    assert spans[0][0] == 0 and spans[-1][1] == sample.response_length  # nothing after the final action


def test_pieces_concatenate_to_what_the_chat_template_renders(tok):
    """Token-in-token-out concatenation equals rendering the whole conversation at once."""
    metadata = dict(env="hanoi", seed=3, disks=3)
    first, actions, observations = replay(metadata)
    sample = build_expert_sample(make_env, None, Sample(metadata=metadata), tok)
    messages = [{"role": "user", "content": first}]
    for action, obs in zip(actions, observations[:-1]):
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
    messages.append({"role": "assistant", "content": actions[-1]})
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(sample.tokens, skip_special_tokens=False) == rendered.rstrip("\n")


def test_chat_layout_helpers(tok):
    ids = chat_layout.encode_action(tok, "move A C")
    assert ids[-1] == chat_layout.action_stop_token_id(tok) == tok.convert_tokens_to_ids("<|im_end|>")
    assert chat_layout.decode_action(tok, ids + [5, 6]) == "move A C"
    assert tok.decode(chat_layout.encode_observation(tok, "A:1 B: C:2")) .startswith("\n<|im_start|>user\nA:1")
    bare = build_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        chat_layout.encode_prompt(bare, "hi")


def test_wrong_or_missing_expert_actions_fail_clearly(tok):
    metadata = dict(env="gridnav", seed=1, size=5, walls=0.0)
    with pytest.raises(ValueError, match="did not solve"):
        build_expert_sample(make_env, None, Sample(metadata={**metadata, "expert_actions": ["up"]}), tok)

    class NoExpert:
        def reset(self):
            return "hello"

        def close(self):
            pass

    with pytest.raises(ValueError, match="no expert actions"):
        build_expert_sample(lambda args, sample: NoExpert(), None, Sample(metadata={}), tok)


def test_dataset_expert_actions_take_precedence(tok):
    metadata = dict(env="gridnav", seed=2, size=5, walls=0.0)
    _, actions, _ = replay(metadata)
    detour = sorted(actions, key=lambda a: a in ("up", "down"), reverse=True)  # vertical first: still optimal
    assert detour != actions
    sample = build_expert_sample(make_env, None, Sample(metadata={**metadata, "expert_actions": detour}), tok)
    assert sample.metadata["expert_actions"] == detour and sample.metadata["success"]


def test_cli_writes_samples_that_load_back(tmp_path, tok):
    tasks = tmp_path / "tasks.jsonl"
    make_data.main(["--env", "hanoi", "--n", "6", "--seed", "0", "--out", str(tasks), "--disks", "3"])
    out = tmp_path / "sft" / "sft.jsonl"
    assert expert_sft_main(["--data", str(tasks), "--out", str(out), "--tokenizer", "tiny"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    task_rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    assert len(rows) == len(task_rows) == 6
    for row, task in zip(rows, task_rows):
        sample = Sample.from_dict(row)
        sample.validate()
        assert sample.metadata["expert_actions"] == task["expert_actions"]
        trained = [t for t, m in zip(sample.tokens[sample.prompt_length:], sample.loss_mask) if m]
        assert tok.decode(trained, skip_special_tokens=False) == "".join(a + "<|im_end|>" for a in task["expert_actions"])
