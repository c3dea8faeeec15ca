"""Expert trajectories become SFT samples in exactly the agent loop's token layout."""

import asyncio
import json
from argparse import Namespace

import pytest

from examples.agent_envs import build_env
from examples.agent_envs import make_data
from examples.multi_turn_tcod import chat_layout, rollout
from slime.rollout import sample_hooks
from slime.rollout.expert_sft import build_expert_sample, main as expert_sft_main
from slime.utils.tiny_models import build_tokenizer
from slime.utils.types import Sample

# Qwen3's generation prompt: with enable_thinking=False an empty think block opens the assistant turn.
QWEN3_LIKE_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def replay(metadata):
    """First observation, expert actions and the chat messages the env shows after each, gathered
    independently of expert_sft."""
    env = build_env(Sample(metadata=metadata), None)
    first, _ = env.reset()
    actions = env.expert_actions()
    return first, actions, [env.format_observation(env.step(a)[0]) for a in actions]


TASKS = [dict(env="gridnav", seed=s, size=z, walls=w) for s, z, w in [(0, 3, 0.0), (1, 6, 0.2), (2, 10, 0.2)]] + \
        [dict(env="hanoi", seed=s, disks=d) for s, d in [(0, 1), (3, 3), (4, 5)]]


@pytest.mark.parametrize("metadata", TASKS)
@pytest.mark.parametrize("system", [None, "You are an agent."])
def test_layout_invariants(tok, metadata, system):
    first, actions, messages = replay(metadata)
    sample = build_expert_sample(build_env, None, Sample(index=7, metadata=dict(metadata)), tok, system=system)
    sample.validate()
    prompt_len = sample.prompt_length
    response = sample.tokens[prompt_len:]
    assert len(sample.tokens) == prompt_len + sample.response_length
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length == len(response)

    # The prompt is the chat template on the first observation, ending with the assistant header.
    prompt_messages = [{"role": "system", "content": system}] if system else []
    prompt_messages.append({"role": "user", "content": first})
    expected_prompt = tok.apply_chat_template(prompt_messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(sample.tokens[:prompt_len], skip_special_tokens=False) == expected_prompt

    spans = sample.metadata["turn_spans"]
    assert sample.metadata["num_turns"] == len(spans) == len(actions)
    assert sample.metadata["success"] is True and sample.status == Sample.Status.COMPLETED
    assert len(sample.metadata["turn_rewards"]) == len(actions) and sample.reward == pytest.approx(1.0)
    stop = chat_layout.turn_stop_id(tok)
    covered = set()
    for (start, end), action in zip(spans, actions):
        assert all(sample.loss_mask[start:end]) and response[end - 1] == stop
        assert tok.decode(response[start:end], skip_special_tokens=False) == action + "<|im_end|>"
        covered.update(range(start, end))
    # Every masked token lies between two turns and decodes to exactly that observation's wrapper.
    assert {i for i, m in enumerate(sample.loss_mask) if m} == covered
    gaps = [(spans[i][1], spans[i + 1][0]) for i in range(len(spans) - 1)]
    assert sum(b - a for a, b in gaps) == sample.loss_mask.count(0)
    for (a, b), message in zip(gaps, messages):
        assert tok.decode(response[a:b], skip_special_tokens=False) == chat_layout.observation_text(tok, message)
    assert spans[0][0] == 0 and spans[-1][1] == sample.response_length  # nothing after the final action


def test_pieces_concatenate_to_what_the_chat_template_renders(tok):
    """Token-in-token-out concatenation equals rendering the whole conversation at once."""
    metadata = dict(env="hanoi", seed=3, disks=3)
    first, actions, messages = replay(metadata)
    sample = build_expert_sample(build_env, None, Sample(metadata=metadata), tok)
    conversation = [{"role": "user", "content": first}]
    for action, message in zip(actions, messages[:-1]):
        conversation += [{"role": "assistant", "content": action}, message]
    conversation.append({"role": "assistant", "content": actions[-1]})
    rendered = tok.apply_chat_template(conversation, tokenize=False)
    assert tok.decode(sample.tokens, skip_special_tokens=False) == rendered.rstrip("\n")


class _PlaysTheExpert:
    """/generate as an engine that samples exactly the expert's next action and its <|im_end|>."""

    def __init__(self, tokenizer, actions):
        self.tokenizer, self.actions, self.turn = tokenizer, actions, 0

    async def post(self, url, payload, max_retries=60, headers=None):
        ids = chat_layout.encode_action(self.tokenizer, self.actions[self.turn])
        self.turn += 1
        meta = {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, i, None] for i in ids]}
        return {"text": self.tokenizer.decode(ids), "meta_info": meta}


class _State:
    def __init__(self, tokenizer):
        self.tokenizer, self.aborted = tokenizer, False


@pytest.mark.parametrize("metadata", [TASKS[1], TASKS[4]])
@pytest.mark.parametrize("thinking_off", [False, True])
def test_same_sequence_as_the_agent_loop_playing_the_expert(monkeypatch, metadata, thinking_off):
    """The student that plays the expert's actions builds the very tokens (and mask) the SFT sample holds."""
    tok = build_tokenizer()
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    kwargs = {"enable_thinking": False} if thinking_off else {}
    _, actions, _ = replay(metadata)
    args = Namespace(hf_checkpoint="unused", max_turns=len(actions), max_turn_response_len=64,
                     rollout_max_context_len=None, eval_max_context_len=None,
                     rollout_interaction_env_path="examples.agent_envs", env_step_timeout=30,
                     sglang_router_ip="127.0.0.1", sglang_router_port=1, partial_rollout=False,
                     apply_chat_template_kwargs=kwargs, use_opd=False, use_tcod=False)
    monkeypatch.setattr(rollout, "post", _PlaysTheExpert(tok, actions).post)
    monkeypatch.setattr(rollout, "GenerateState", lambda args: _State(tok))
    sample_hooks.set_current_rollout_id(0)
    played = asyncio.run(rollout.generate(args, Sample(index=0, metadata=dict(metadata)),
                                          {"temperature": 1.0, "max_new_tokens": 4000}))
    assert played.metadata["outcome"] == "done" and played.metadata["success"]
    expert = build_expert_sample(build_env, args, Sample(index=0, metadata=dict(metadata)), tok)
    assert expert.tokens == played.tokens and expert.loss_mask == played.loss_mask
    assert expert.metadata["turn_spans"] == played.metadata["turn_spans"]
    if thinking_off:  # the template kwargs reached every render: the prompt and every observation
        assert tok.decode(expert.tokens).count("<think>\n\n</think>\n\n") == len(actions)


def test_chat_layout_helpers(tok):
    ids = chat_layout.encode_action(tok, "move A C")
    assert ids[-1] == chat_layout.turn_stop_id(tok) == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(ids[:-1]) == "move A C"
    assert tok.decode(chat_layout.encode_observation(tok, "A:1 B: C:2")).startswith("\n<|im_start|>user\nA:1")
    bare = build_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        chat_layout.encode_prompt(bare, "hi")


def test_wrong_or_missing_expert_actions_fail_clearly(tok):
    metadata = dict(env="gridnav", seed=1, size=5, walls=0.0)
    with pytest.raises(ValueError, match="did not solve"):
        build_expert_sample(build_env, None, Sample(metadata={**metadata, "expert_actions": ["up"]}), tok)

    class NoExpert:
        def reset(self):
            return "hello", {}

        def format_observation(self, observation):
            return {"role": "user", "content": observation}

        def close(self):
            pass

    with pytest.raises(ValueError, match="no expert actions"):
        build_expert_sample(lambda sample, args: NoExpert(), None, Sample(metadata={}), tok)


def test_dataset_expert_actions_take_precedence(tok):
    metadata = dict(env="gridnav", seed=2, size=5, walls=0.0)
    _, actions, _ = replay(metadata)
    detour = sorted(actions, key=lambda a: a in ("up", "down"), reverse=True)  # vertical first: still optimal
    assert detour != actions
    sample = build_expert_sample(build_env, None, Sample(metadata={**metadata, "expert_actions": detour}), tok)
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
        expert = task["metadata"]["expert_actions"]
        assert sample.metadata["expert_actions"] == expert
        trained = [t for t, m in zip(sample.tokens[sample.prompt_length:], sample.loss_mask) if m]
        assert tok.decode(trained, skip_special_tokens=False) == "".join(a + "<|im_end|>" for a in expert)


def test_sft_rollout_feeds_the_expert_trajectories_of_the_step(tmp_path, tok):
    from slime.rollout import sft_rollout
    from slime.utils.arguments import get_parser, validate_args
    from slime.utils.tiny_models import save_tiny_checkpoint

    model = save_tiny_checkpoint(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2)
    args = validate_args(get_parser().parse_args([
        "--hf-checkpoint", str(model), "--loss-type", "sft_loss", "--rollout-batch-size", "2",
        "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
        "--rollout-interaction-env-path", "examples.agent_envs"]))

    class Tasks:
        def get_samples(self, n):
            return [[Sample(index=i, group_index=i, metadata=dict(TASKS[i]))] for i in range(n)]

    groups = sft_rollout.generate_rollout(args, 3, Tasks())
    assert [len(g) for g in groups] == [1, 1]
    for i, [sample] in enumerate(groups):
        expected = build_expert_sample(build_env, args, Sample(index=i, metadata=dict(TASKS[i])), tok)
        assert sample.tokens == expected.tokens and sample.loss_mask == expected.loss_mask
        assert sample.rollout_id == 3 and sample.metadata["task_reward"] == pytest.approx(1.0)
