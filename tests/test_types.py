import pytest
import torch

from slime.utils.types import Sample, Status


def fresh(prompt_tokens=(1, 2, 3)):
    return Sample(index=0, prompt="p", tokens=list(prompt_tokens))


def test_multi_turn_growth_keeps_layout_aligned():
    s = fresh()
    s.append_response_tokens(tokens=[10, 11], log_probs=[-0.1, -0.2], text="ab")
    s.append_response_tokens(tokens=[20, 21, 22], trainable=False, text="obs")
    s.append_response_tokens(tokens=torch.tensor([12]), log_probs=torch.tensor([-0.3]), text="c")
    assert s.tokens == [1, 2, 3, 10, 11, 20, 21, 22, 12]
    assert s.response_length == 6 and s.prompt_length == 3
    assert s.loss_mask == [1, 1, 0, 0, 0, 1]
    assert s.rollout_log_probs == pytest.approx([-0.1, -0.2, 0.0, 0.0, 0.0, -0.3])
    assert s.effective_response_length == 3 and s.response == "abobsc"
    s.validate()


def test_observation_first_then_trainable_backfills_log_probs():
    s = fresh()
    s.append_response_tokens(tokens=[5, 6], trainable=False)
    assert s.rollout_log_probs is None and s.loss_mask == [0, 0]
    s.append_response_tokens(tokens=[7], log_probs=[-1.0])
    assert s.rollout_log_probs == [0.0, 0.0, -1.0]
    s.validate()


def test_trainable_tokens_need_log_probs():
    with pytest.raises(ValueError, match="log_probs"):
        fresh().append_response_tokens(tokens=[4, 5])


def test_non_trainable_tokens_must_not_pass_log_probs():
    with pytest.raises(ValueError, match="must not pass log_probs"):
        fresh().append_response_tokens(tokens=[4], log_probs=[-0.5], trainable=False)


def test_log_prob_count_must_match_tokens():
    s = fresh()
    with pytest.raises(ValueError, match="2 log_probs for 3 tokens"):
        s.append_response_tokens(tokens=[4, 5, 6], log_probs=[-0.1, -0.2])
    assert s.response_length == 0 and s.tokens == [1, 2, 3]  # nothing half-applied


@pytest.mark.parametrize("finish,status", [("stop", Status.COMPLETED), ("length", Status.TRUNCATED),
                                           ("abort", Status.ABORTED)])
def test_status_from_finish_reason(finish, status):
    s = fresh()
    s.append_response_tokens(tokens=[4], log_probs=[-0.1], meta_info={"finish_reason": {"type": finish}})
    assert s.status is status


def test_status_untouched_without_terminal_update():
    s = fresh()
    s.append_response_tokens(tokens=[4], log_probs=[-0.1], meta_info={"finish_reason": {"type": "length"}},
                             update_terminal_info=False)
    assert s.status is Status.PENDING
    s.append_response_tokens(tokens=[5], log_probs=[-0.1], meta_info={})
    assert s.status is Status.PENDING


def test_validate_names_the_broken_field():
    s = fresh()
    s.append_response_tokens(tokens=[4, 5], log_probs=[-0.1, -0.2])
    s.teacher_log_probs = [-0.5]
    with pytest.raises(ValueError, match="teacher_log_probs"):
        s.validate()
    s.teacher_log_probs = [-0.5, -0.6]
    s.validate()
    s.loss_mask = [1, 2]
    with pytest.raises(ValueError, match="loss_mask"):
        s.validate()
    s.loss_mask = [1, 1]
    s.response_length = 10
    with pytest.raises(ValueError, match="response_length"):
        s.validate()


def test_reward_value():
    assert Sample(reward=2).get_reward_value() == 2.0
    assert Sample().get_reward_value() == 0.0
    with pytest.raises(ValueError, match="--reward-key"):
        Sample(reward={"acc": 1.0}).get_reward_value()
    args = type("A", (), {"reward_key": "acc"})()
    assert Sample(reward={"acc": 1.0}).get_reward_value(args) == 1.0


def test_dict_round_trip():
    s = fresh()
    s.group_index, s.rollout_id, s.label, s.reward = 3, 7, "gold", {"acc": 1.0}
    s.append_response_tokens(tokens=[4, 5], log_probs=[-0.1, -0.2], meta_info={"finish_reason": {"type": "stop"}})
    s.teacher_log_probs = [-0.3, -0.4]
    s.metadata["episode"] = {"turns": [1, 2]}
    data = s.to_dict()
    assert data["status"] == "completed"
    back = Sample.from_dict(data)
    assert back == s and back.status is Status.COMPLETED
    data["metadata"]["episode"]["turns"].append(3)  # to_dict copies deeply
    assert s.metadata["episode"]["turns"] == [1, 2]
    with pytest.raises(ValueError, match="unknown field"):
        Sample.from_dict({**s.to_dict(), "bogus": 1})
