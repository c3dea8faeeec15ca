import pytest

from slime.rollout.tcod import b2f_prefix_length, curriculum_depth

# (step, depth) with the official settings: k_start = 1, k_max = 30 (ALFWorld / ScienceWorld).
F2B_ETA6 = [(0, 1), (5, 1), (6, 2), (11, 2), (12, 3), (60, 11), (173, 29), (174, 30), (249, 30)]
B2F_ETA5 = [(0, 1), (4, 1), (5, 2), (9, 2), (10, 3), (144, 29), (145, 30), (249, 30)]


@pytest.mark.parametrize("step,depth", F2B_ETA6)
def test_depth_table_eta6(step, depth):
    assert curriculum_depth(step, k_start=1, eta=6, k_max=30) == depth


@pytest.mark.parametrize("step,depth", B2F_ETA5)
def test_depth_table_eta5(step, depth):
    assert curriculum_depth(step, k_start=1, eta=5, k_max=30) == depth


def test_depth_is_monotone_and_grows_by_at_most_one():
    depths = [curriculum_depth(n, 1, 5, 30) for n in range(300)]
    assert all(0 <= b - a <= 1 for a, b in zip(depths, depths[1:]))
    assert depths[0] == 1 and depths[-1] == 30


def test_larger_k_start():
    assert [curriculum_depth(n, 3, 2, 5) for n in range(8)] == [3, 3, 4, 4, 5, 5, 5, 5]


@pytest.mark.parametrize("step,prefix", [(0, 11), (4, 11), (5, 10), (27, 6), (50, 1), (54, 1), (55, 0), (200, 0)])
def test_b2f_prefix_table_for_expert_length_12(step, prefix):
    assert b2f_prefix_length(12, curriculum_depth(step, k_start=1, eta=5, k_max=30)) == prefix


@pytest.mark.parametrize("eta", [5, 6])
@pytest.mark.parametrize("expert_len", [1, 2, 7, 12, 30])
def test_b2f_prefix_matches_official_formula(eta, expert_len):
    # Official code: prefix = max(0, (L_exp - 1) - n // eta) (k_start = 1; here L_exp <= k_max).
    for n in range(250):
        assert b2f_prefix_length(expert_len, curriculum_depth(n, 1, eta, 30)) == max(0, (expert_len - 1) - n // eta)


@pytest.mark.parametrize("expert_len", [None, 0])
def test_no_expert_actions_means_full_episode(expert_len):
    assert b2f_prefix_length(expert_len, 1) == 0


@pytest.mark.parametrize("kw,match", [
    (dict(step=-1), "step"),
    (dict(k_start=0), "k_start"),
    (dict(eta=0), "eta"),
    (dict(eta=-3), "eta"),
    (dict(k_start=5, k_max=4), "k_max"),
])
def test_bad_inputs_raise(kw, match):
    params = dict(step=0, k_start=1, eta=5, k_max=30)
    params.update(kw)
    with pytest.raises(ValueError, match=match):
        curriculum_depth(**params)


# ---------------------------------------------------------------------------- episode plans
def _plan_args(*extra):
    from slime.utils.arguments import get_parser, validate_args

    args = get_parser().parse_args(["--use-opd", "--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate",
                                    "--max-turns", "10", "--rollout-interaction-env-path", "examples.agent_envs", *extra])
    return validate_args(args)


def test_episode_plans_follow_the_schedule():
    from slime.rollout.tcod import episode_plan

    f2b = _plan_args("--use-tcod", "--tcod-mode", "f2b", "--tcod-eta", "3", "--tcod-k-max", "4")
    assert [episode_plan(f2b, n, 10)["max_turns"] for n in (0, 2, 3, 8, 9, 100)] == [1, 1, 2, 3, 4, 4]
    assert episode_plan(f2b, 5, 10, evaluation=True) == {"mode": "full", "max_turns": 10, "step": 5}

    b2f = _plan_args("--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "2")
    plans = [episode_plan(b2f, n, 10) for n in range(8)]
    # B2F: replayed and student turns together are capped by max_turns, as the official code caps them.
    assert all(p["mode"] == "b2f" and p["max_turns"] == 10 for p in plans)
    assert [p["depth"] for p in plans] == [1, 1, 2, 2, 3, 3, 4, 4]

    vanilla = _plan_args()
    assert episode_plan(vanilla, 7, 10) == {"mode": "full", "max_turns": 10, "step": 7}
    with pytest.raises(RuntimeError, match="no current rollout id"):  # TCOD outside RolloutManager
        episode_plan(f2b, None, 10)
