"""Built-in puzzles through ``examples.agent_envs`` (upstream's ``build_env`` contract): optimal experts at every
horizon, invalid actions, thinking replies, determinism, the dispatcher and the data generator."""

import itertools
import json
from collections import deque

import pytest

from examples.agent_envs import ENV_MODULES, build_env, env_module, make_data, no_expert
from slime.utils.types import Sample
from env_steps import play


def build(**metadata):
    return build_env(Sample(metadata=metadata), None)  # positionally, as the agent loop calls it


def reset(env):
    observation, info = env.reset()
    assert isinstance(observation, str) and isinstance(info, dict)
    return observation




def step(env, action):
    return play(env, [action])[0]


# ----------------------------------------------------------------------------- independent solvers
def grid_bfs_length(first_observation: str) -> int:
    """Shortest path read from the observation alone (map when walls, else open grid)."""
    lines = first_observation.splitlines()
    size = int(lines[0].split()[1].split("x")[0])
    pos_line = lines[-1].split()
    start = tuple(map(int, pos_line[1].split(",")))
    goal = tuple(map(int, pos_line[3].split(",")))
    grid = lines[2:2 + size] if "Map" in first_observation else ["." * size] * size
    walls = {(x, y) for y, row in enumerate(grid) for x, c in enumerate(row) if c == "#"}
    dist, queue = {start: 0}, deque([start])
    while queue:
        x, y = queue.popleft()
        for nx, ny in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
            if 0 <= nx < size and 0 <= ny < size and (nx, ny) not in walls and (nx, ny) not in dist:
                dist[(nx, ny)] = dist[(x, y)] + 1
                queue.append((nx, ny))
    return dist[goal]


def parse_pegs(text: str):
    return tuple(tuple(int(c) for c in part.split(":")[1]) for part in text.split()[:3])


def hanoi_bfs_length(first_observation: str) -> int:
    """Shortest solution by brute-force search over peg states, read from the observation."""
    header, board = first_observation.splitlines()
    target = "ABC".index(header.split("Stack all on ")[1][0])
    start = parse_pegs(board)
    n = sum(len(p) for p in start)
    goal = tuple(tuple(range(n, 0, -1)) if i == target else () for i in range(3))
    dist, queue = {start: 0}, deque([start])
    while queue:
        state = queue.popleft()
        if state == goal:
            return dist[state]
        for a, b in itertools.permutations(range(3), 2):
            if state[a] and (not state[b] or state[b][-1] > state[a][-1]):
                pegs = list(state)
                pegs[b] = state[b] + (state[a][-1],)
                pegs[a] = state[a][:-1]
                nxt = tuple(pegs)
                if nxt not in dist:
                    dist[nxt] = dist[state] + 1
                    queue.append(nxt)
    raise AssertionError("unsolvable")


# ----------------------------------------------------------------------------- experts
@pytest.mark.parametrize("size,walls", [(2, 0.0), (4, 0.0), (5, 0.2), (8, 0.2), (12, 0.3), (16, 0.0)])
def test_gridnav_expert_is_optimal_and_solves(size, walls):
    for seed in range(25):
        env = build(env="gridnav", seed=seed, size=size, walls=walls)
        observation = reset(env)
        expert = env.expert_actions()
        assert len(expert) == grid_bfs_length(observation)
        steps = play(env, expert)
        assert all(not done for _, _, done, _ in steps[:-1])
        _, reward, done, info = steps[-1]
        assert done and info["success"] and reward == 1.0
        assert sum(r for _, r, _, _ in steps) == 1.0  # sparse by default


@pytest.mark.parametrize("disks", [1, 2, 3, 4])
def test_hanoi_expert_is_optimal_from_random_starts(disks):
    for seed in range(25):
        env = build(env="hanoi", seed=seed, disks=disks)
        observation = reset(env)
        expert = env.expert_actions()
        assert len(expert) == hanoi_bfs_length(observation)
        *_, (obs, reward, done, info) = play(env, expert)
        assert done and info["success"] and reward == 1.0 and obs.endswith("solved")


@pytest.mark.parametrize("disks", [1, 3, 5, 6])
def test_hanoi_tower_start_takes_two_to_the_n_minus_one(disks):
    env = build(env="hanoi", seed=7, disks=disks, start="tower")
    reset(env)
    expert = env.expert_actions()
    assert len(expert) == 2 ** disks - 1
    assert play(env, expert)[-1][3]["success"]


def test_horizons_reach_thirty_turns_and_more():
    grid = build(env="gridnav", seed=0, size=20, walls=0.2, min_dist=30)
    reset(grid)
    assert len(grid.expert_actions()) >= 30
    assert play(grid, grid.expert_actions())[-1][3]["success"]
    hanoi = build(env="hanoi", seed=0, disks=6, min_dist=40)
    reset(hanoi)
    assert 40 <= len(hanoi.expert_actions()) <= 63
    assert play(hanoi, hanoi.expert_actions())[-1][3]["success"]


def test_min_max_dist_bounds_and_impossible_bounds():
    for seed in range(10):
        env = build(env="gridnav", seed=seed, size=6, walls=0.2, min_dist=5, max_dist=6)
        reset(env)
        assert 5 <= len(env.expert_actions()) <= 6
    with pytest.raises(ValueError, match="no layout"):
        build(env="gridnav", seed=0, size=3, min_dist=10)
    with pytest.raises(ValueError, match="must be in"):
        build(env="hanoi", seed=0, disks=12)


# ----------------------------------------------------------------------------- replies: invalid, thinking
@pytest.mark.parametrize("metadata", [dict(env="gridnav", seed=3, size=5), dict(env="hanoi", seed=3, disks=3)])
@pytest.mark.parametrize("bad", ["xyz", "", "   ", "move A A", "jump\nnow", "m" * 500])
def test_unparseable_actions_are_observations_not_exceptions(metadata, bad):
    env = build(**metadata)
    reset(env)
    before = env.state
    obs, reward, done, info = step(env, bad)
    assert obs.startswith("Invalid action") and "Valid actions:" in obs and len(obs) < 120
    assert (reward, done, info["invalid_action"], info["success"]) == (0.0, False, True, False)
    assert env.state == before


def test_actions_are_normalised_like_model_output():
    env = build(env="hanoi", seed=3, disks=3)
    reset(env)
    move = env.expert_actions()[0]
    obs, _, _, info = step(env, "  " + move.upper() + "  \n")
    assert not info["invalid_action"] and not obs.startswith("Invalid")


@pytest.mark.parametrize("metadata", [dict(env="gridnav", seed=3, size=5), dict(env="hanoi", seed=3, disks=3)])
def test_thinking_replies_act_on_what_follows_the_think_block(metadata):
    env = build(**metadata)
    reset(env)
    expert = env.expert_actions()
    # Qwen3's thinking layout; the reasoning may name other actions, only the part after </think> counts.
    replies = [f"<think>\nnot {a}, maybe left; move A B?\n</think>\n\n{a}" for a in expert]
    *_, (obs, reward, done, info) = play(env, replies)
    assert done and info["success"] and reward == 1.0


@pytest.mark.parametrize("metadata", [dict(env="gridnav", seed=3, size=5), dict(env="hanoi", seed=3, disks=3)])
def test_a_reply_cut_inside_its_thought_is_an_invalid_step(metadata):
    env = build(**metadata, max_steps=2)
    reset(env)
    before, move = env.state, env.expert_actions()[0]
    obs, reward, done, info = step(env, f"<think>\nI will play {move}")  # cut by the turn's token budget
    assert "ended inside <think>" in obs and "</think>" in obs
    assert (reward, done, info["invalid_action"], info["success"]) == (0.0, False, True, False)
    assert env.state == before  # the action named inside the thought was not played
    _, _, done, info = step(env, "<think>")
    assert done and info["out_of_steps"]  # it counts towards max_steps like any step


def test_impossible_moves_keep_the_state_and_say_why():
    env = build(env="hanoi", seed=1, disks=3, start="tower")
    pegs = parse_pegs(reset(env).splitlines()[1])
    empty = "ABC"[[len(p) for p in pegs].index(0)]
    obs, _, done, info = step(env, f"move {empty} A" if empty != "A" else "move A B")
    assert obs.startswith("Illegal") and info["invalid_action"] and not done
    # The observation names the blocked directions; walking into one is refused, the position kept.
    grid, observation = next((g, f) for g in (build(env="gridnav", seed=s, size=4, walls=0.2) for s in range(50))
                             for f in [reset(g)] if "wall:" in f.splitlines()[-1])
    blocked = observation.split("wall:")[1].split(",")[0]
    position = observation.splitlines()[-1].split(" wall:")[0]
    obs, _, done, info = step(grid, blocked)
    assert obs.startswith(f"Blocked {blocked}. {position}") and info["invalid_action"] and not done


def test_every_episode_ends_within_max_steps():
    env = build(env="gridnav", seed=2, size=6, max_steps=7)
    reset(env)
    results = play(env, ["nonsense"] * 7)
    assert [done for _, _, done, _ in results] == [False] * 6 + [True]
    assert results[-1][3].get("out_of_steps") and not results[-1][3]["success"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("up")


def test_shaping_adds_progress_reward():
    env = build(env="gridnav", seed=4, size=7, walls=0.0, shaping=0.1)
    reset(env)
    expert = env.expert_actions()
    rewards = [r for _, r, _, _ in play(env, expert)]
    assert sum(rewards) == pytest.approx(1.0 + 0.1 * len(expert))
    # A step away from the goal costs the same shaping it would have earned.
    last = reset(env).splitlines()[-1].split()
    x, y = map(int, last[1].split(","))
    gx, gy = map(int, last[3].split(","))
    away = ("left" if gx > x else "right") if gx != x else ("up" if gy > y else "down")
    obs, reward, _, info = step(env, away)
    assert not info["invalid_action"] and reward == pytest.approx(-0.1)


def test_observations_are_formatted_as_user_messages():
    env = build(env="hanoi", seed=0, disks=2)
    reset(env)
    observation, _, _ = env.step("xyz")
    assert env.format_observation(observation) == {"role": "user", "content": observation}
    env.close()


# ----------------------------------------------------------------------------- determinism, dispatch
def test_tasks_are_deterministic_and_seeds_differ():
    for md in (dict(env="gridnav", seed=5, size=9, walls=0.2), dict(env="hanoi", seed=5, disks=4)):
        a, b = build(**md), build(**md)
        assert reset(a) == reset(b) and a.expert_actions() == b.expert_actions()
    firsts = {reset(build(env="gridnav", seed=s, size=9)) for s in range(10)}
    assert len(firsts) == 10


def test_dispatcher_reads_metadata_dicts_and_json_labels():
    row = {"metadata": {"env": "hanoi", "seed": 2, "disks": 2}}
    from_label = build_env(sample=Sample(label=json.dumps(row["metadata"])), args=None)  # upstream's keyword call
    assert reset(build_env(row)) == reset(from_label)
    with pytest.raises(ValueError, match=r"known environments: \['alfworld', 'gridnav', 'hanoi'"):
        build_env(Sample(metadata={"env": "chess"}))
    with pytest.raises(ValueError, match="no 'env'"):
        build_env(Sample(metadata={"seed": 1}))
    with pytest.raises(ValueError, match="'seed'"):
        build_env(Sample(metadata={"env": "gridnav"}))


def test_every_env_module_has_the_upstream_hook():
    # The games' own packages are imported only when an episode starts, so these imports stay cheap.
    for name in ENV_MODULES:
        module = env_module(name)
        assert callable(module.build_env) and callable(module.task_metadata) and not hasattr(module, "make_env")
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        env_module("chess")


def test_no_expert_hides_the_expert_path_and_plays_the_same_episode():
    md = dict(env="hanoi", seed=4, disks=3)
    hidden, full = no_expert.build_env(Sample(metadata=md), None), build(**md)
    assert not hasattr(hidden, "expert_actions")
    assert reset(hidden) == reset(full)
    steps = play(hidden, full.expert_actions())
    assert steps[-1][3]["success"] and hidden.format_observation("x") == {"role": "user", "content": "x"}
    hidden.close()


def test_make_data_writes_reproducible_rows_within_the_horizon(tmp_path):
    outs = []
    for name in ("a.jsonl", "b.jsonl"):
        out = tmp_path / name
        make_data.main(["--env", "gridnav", "--n", "20", "--seed", "3", "--out", str(out), "--size", "8",
                        "--walls", "0.2", "--min-len", "6", "--max-len", "9"])
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    rows = [json.loads(line) for line in outs[0].splitlines()]
    assert len(rows) == 20 and len({r["input"] for r in rows}) == 20
    for row in rows:
        actions = row["metadata"]["expert_actions"]
        assert 6 <= len(actions) <= 9
        env = build_env(Sample(metadata=row["metadata"]))  # metadata alone rebuilds the task
        assert reset(env) == row["input"] and env.expert_actions() == actions
        assert {**json.loads(row["label"]), "expert_actions": actions} == row["metadata"]


def test_make_data_passes_this_repositorys_options(tmp_path):
    out = tmp_path / "h.jsonl"
    make_data.main(["--env", "hanoi", "--n", "3", "--out", str(out), "--disks", "4", "--start", "tower"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["metadata"]["disks"], r["metadata"]["start"]) for r in rows] == [(4, "tower")] * 3
    assert all(len(r["metadata"]["expert_actions"]) == 15 for r in rows)
    assert [r["metadata"]["seed"] for r in make_data.task_rows("hanoi", 2, 7, {"disks": 2})] == [7, 8]


def test_make_data_fails_clearly_when_the_horizon_is_impossible(tmp_path, capsys):
    # Refused when the flags are read (no seed is tried), naming the setting that can hold the length.
    with pytest.raises(SystemExit) as exit_info:
        make_data.main(["--env", "hanoi", "--n", "2", "--out", str(tmp_path / "x.jsonl"), "--disks", "2",
                        "--min-len", "5"])
    assert exit_info.value.code == 2
    assert "--disks 3 or more holds 5" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_make_data_exclude_leaves_out_the_tasks_of_another_file(tmp_path, capsys):
    train, evaluation = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    grid = ["--env", "gridnav", "--size", "6", "--walls", "0", "--min-len", "4", "--max-len", "8"]
    make_data.main(grid + ["--n", "60", "--seed", "0", "--out", str(train)])
    assert "seeds 0.." in capsys.readouterr().err  # the range used, to keep another file's --seed above it
    make_data.main(grid + ["--n", "30", "--seed", "0", "--exclude", str(train), "--out", str(evaluation)])
    labels = [{json.loads(line)["label"] for line in open(path)} for path in (train, evaluation)]
    assert len(labels[0]) == 60 and len(labels[1]) == 30 and not labels[0] & labels[1]
    with pytest.raises(SystemExit):  # argparse's error: a missing --exclude file is named, not a traceback
        make_data.main(grid + ["--n", "3", "--exclude", str(tmp_path / "none.jsonl"), "--out", str(evaluation)])
    assert "--exclude: not a make_data file (FileNotFoundError" in capsys.readouterr().err


def test_make_data_exclude_catches_the_same_puzzle_dealt_by_another_seed(tmp_path):
    train, evaluation = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    hanoi = ["--env", "hanoi", "--disks", "3", "--min-len", "2", "--max-len", "7"]
    make_data.main(hanoi + ["--n", "40", "--seed", "0", "--out", str(train)])
    inputs = [json.loads(line)["input"] for line in open(train)]
    assert len(set(inputs)) < 40  # 3-disk puzzles repeat across seeds: a seed range alone is not a split
    make_data.main(hanoi + ["--n", "5", "--seed", "100000", "--exclude", str(train), "--out", str(evaluation)])
    assert not {json.loads(line)["input"] for line in open(evaluation)} & set(inputs)
