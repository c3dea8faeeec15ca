"""Built-in puzzles: optimal experts at every horizon, invalid actions, determinism, the data generator."""

import itertools
import json
from collections import deque

import pytest

from examples.agent_envs import make_env
from examples.agent_envs import make_data
from slime.utils.types import Sample


def build(**metadata):
    return make_env(None, Sample(metadata=metadata))


def play(env, actions):
    steps = [env.step(a) for a in actions]
    return steps


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
        first = env.reset()
        expert = env.expert_actions()
        assert len(expert) == grid_bfs_length(first)
        steps = play(env, expert)
        assert all(not done for _, _, done, _ in steps[:-1])
        _, reward, done, info = steps[-1]
        assert done and info["success"] and reward == 1.0
        assert sum(r for _, r, _, _ in steps) == 1.0  # sparse by default


@pytest.mark.parametrize("disks", [1, 2, 3, 4])
def test_hanoi_expert_is_optimal_from_random_starts(disks):
    for seed in range(25):
        env = build(env="hanoi", seed=seed, disks=disks)
        first = env.reset()
        expert = env.expert_actions()
        assert len(expert) == hanoi_bfs_length(first)
        *_, (obs, reward, done, info) = play(env, expert)
        assert done and info["success"] and reward == 1.0 and obs.endswith("solved")


@pytest.mark.parametrize("disks", [1, 3, 5, 6])
def test_hanoi_tower_start_takes_two_to_the_n_minus_one(disks):
    env = build(env="hanoi", seed=7, disks=disks, start="tower")
    env.reset()
    expert = env.expert_actions()
    assert len(expert) == 2 ** disks - 1
    assert play(env, expert)[-1][3]["success"]


def test_horizons_reach_thirty_turns_and_more():
    grid = build(env="gridnav", seed=0, size=20, walls=0.2, min_dist=30)
    grid.reset()
    assert len(grid.expert_actions()) >= 30
    assert play(grid, grid.expert_actions())[-1][3]["success"]
    hanoi = build(env="hanoi", seed=0, disks=6, min_dist=40)
    hanoi.reset()
    assert 40 <= len(hanoi.expert_actions()) <= 63
    assert play(hanoi, hanoi.expert_actions())[-1][3]["success"]


def test_min_max_dist_bounds_and_impossible_bounds():
    for seed in range(10):
        env = build(env="gridnav", seed=seed, size=6, walls=0.2, min_dist=5, max_dist=6)
        env.reset()
        assert 5 <= len(env.expert_actions()) <= 6
    with pytest.raises(ValueError, match="no layout"):
        build(env="gridnav", seed=0, size=3, min_dist=10)
    with pytest.raises(ValueError, match="must be in"):
        build(env="hanoi", seed=0, disks=12)


# ----------------------------------------------------------------------------- invalid actions, limits
@pytest.mark.parametrize("metadata", [dict(env="gridnav", seed=3, size=5), dict(env="hanoi", seed=3, disks=3)])
@pytest.mark.parametrize("bad", ["xyz", "", "   ", "move A A", "jump\nnow", "m" * 500])
def test_unparseable_actions_are_observations_not_exceptions(metadata, bad):
    env = build(**metadata)
    env.reset()
    before = env.state
    obs, reward, done, info = env.step(bad)
    assert obs.startswith("Invalid action") and "Valid actions:" in obs and len(obs) < 120
    assert (reward, done, info["invalid_action"], info["success"]) == (0.0, False, True, False)
    assert env.state == before


def test_actions_are_normalised_like_model_output():
    env = build(env="hanoi", seed=3, disks=3)
    env.reset()
    first = env.expert_actions()[0]
    obs, _, _, info = env.step("  " + first.upper() + "  \n")
    assert not info["invalid_action"] and not obs.startswith("Invalid")


def test_impossible_moves_keep_the_state_and_say_why():
    env = build(env="hanoi", seed=1, disks=3, start="tower")
    first = env.reset()
    pegs = parse_pegs(first.splitlines()[1])
    empty = "ABC"[[len(p) for p in pegs].index(0)]
    obs, _, done, info = env.step(f"move {empty} A" if empty != "A" else "move A B")
    assert obs.startswith("Illegal") and info["invalid_action"] and not done
    # The observation names the blocked directions; walking into one is refused, the position kept.
    grid, first = next((g, f) for g in (build(env="gridnav", seed=s, size=4, walls=0.2) for s in range(50))
                       for f in [g.reset()] if "wall:" in f.splitlines()[-1])
    blocked = first.split("wall:")[1].split(",")[0]
    position = first.splitlines()[-1].split(" wall:")[0]
    obs, _, done, info = grid.step(blocked)
    assert obs.startswith(f"Blocked {blocked}. {position}") and info["invalid_action"] and not done


def test_every_episode_ends_within_max_steps():
    env = build(env="gridnav", seed=2, size=6, max_steps=7)
    env.reset()
    results = [env.step("nonsense") for _ in range(7)]
    assert [done for _, _, done, _ in results] == [False] * 6 + [True]
    assert results[-1][3].get("out_of_steps") and not results[-1][3]["success"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("up")


def test_shaping_adds_progress_reward():
    env = build(env="gridnav", seed=4, size=7, walls=0.0, shaping=0.1)
    env.reset()
    expert = env.expert_actions()
    rewards = [r for _, r, _, _ in play(env, expert)]
    assert sum(rewards) == pytest.approx(1.0 + 0.1 * len(expert))
    # A step away from the goal costs the same shaping it would have earned.
    first = env.reset()
    x, y = map(int, first.splitlines()[-1].split()[1].split(","))
    gx, gy = map(int, first.splitlines()[-1].split()[3].split(","))
    away = ("left" if gx > x else "right") if gx != x else ("up" if gy > y else "down")
    obs, reward, _, info = env.step(away)
    assert not info["invalid_action"] and reward == pytest.approx(-0.1)


# ----------------------------------------------------------------------------- determinism, dispatch
def test_tasks_are_deterministic_and_seeds_differ():
    for md in (dict(env="gridnav", seed=5, size=9, walls=0.2), dict(env="hanoi", seed=5, disks=4)):
        a, b = build(**md), build(**md)
        assert a.reset() == b.reset() and a.expert_actions() == b.expert_actions()
    firsts = {build(env="gridnav", seed=s, size=9).reset() for s in range(10)}
    assert len(firsts) == 10


def test_dispatcher_reads_metadata_dicts_and_json_labels():
    row = {"metadata": {"env": "hanoi", "seed": 2, "disks": 2}}
    from_label = make_env(None, Sample(label=json.dumps(row["metadata"])))
    assert make_env(None, row).reset() == from_label.reset()
    with pytest.raises(ValueError, match="known"):
        make_env(None, Sample(metadata={"env": "chess"}))
    with pytest.raises(ValueError, match="'env'"):
        make_env(None, Sample(metadata={"seed": 1}))
    with pytest.raises(ValueError, match="'seed'"):
        make_env(None, Sample(metadata={"env": "gridnav"}))


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
        assert 6 <= len(row["expert_actions"]) <= 9
        env = make_env(None, Sample(metadata=row["metadata"]))  # metadata alone rebuilds the task
        assert env.reset() == row["input"] and env.expert_actions() == row["expert_actions"]
        assert {**json.loads(row["label"]), "expert_actions": row["expert_actions"]} == row["metadata"]


def test_make_data_fails_clearly_when_the_horizon_is_impossible(tmp_path):
    with pytest.raises(ValueError, match="widen"):
        make_data.main(["--env", "hanoi", "--n", "2", "--out", str(tmp_path / "x.jsonl"), "--disks", "2",
                        "--min-len", "5"])
    assert not (tmp_path / "x.jsonl").exists()
