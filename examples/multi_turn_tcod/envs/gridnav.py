"""Grid navigation: walk from a start cell to a goal cell in a square grid with walls.

Task metadata: ``{"env": "gridnav", "seed": int, "size": int (2..20), "walls": float in [0, 0.5)
(fraction of wall cells, default 0.2), "min_dist"/"max_dist": optional bounds on the optimal path
length, "max_steps": optional (default 2 * optimal + 4), "shaping": optional reward per step closer to
the goal (default 0: 1.0 on the step that reaches it, else 0)}``.

Coordinates are ``x,y`` with x growing right and y growing down, so ``up`` decreases y. Observations
are short to keep long episodes within the context: the first one shows the task, the map (when there
are walls) and ``at X,Y goal X,Y``; later ones show the position, the goal and the blocked neighbours,
e.g. ``at 2,3 goal 4,4 wall:up,left``. The expert is a BFS shortest path that prefers horizontal moves,
so without walls it walks along x first, then y. Every step, invalid ones included, counts towards
``max_steps``, so an episode always ends.
"""

from __future__ import annotations

import random
from collections import deque

MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # order = expert tie-break
ACTIONS = "up down left right"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
blocking = False  # build_env is cheap: the agent loop calls it on the event loop
_MAX_LAYOUT_TRIES = 2000


def int_param(metadata: dict, key: str, default: int | None, low: int, high: int | None = None) -> int:
    """A bounded integer task parameter, with an error that names the field."""
    value = metadata.get(key, default)
    if value is None:
        raise ValueError(f"task metadata needs {key!r} (got {metadata})")
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"task metadata {key!r} must be an integer, got {value!r}") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"task metadata {key!r} must be {bound}, got {value}")
    return value


def reply_action(response_text: str) -> str | None:
    """The action part of a reply: what follows ``</think>`` (Qwen3's thinking mode), else the whole reply.

    None when the reply stops inside a think block (cut by the turn's token budget mid-thought).
    """
    text = response_text or ""
    if THINK_CLOSE in text:
        return text.rsplit(THINK_CLOSE, 1)[1]
    return None if THINK_OPEN in text else text


class GridNavEnv:
    blocking = False  # pure Python and fast: the agent loop calls it on the event loop, not in a thread

    def __init__(self, metadata: dict):
        md = dict(metadata)
        self.size = int_param(md, "size", 5, 2, 20)
        self.seed = int_param(md, "seed", None, 0)
        self.wall_frac = float(md.get("walls", 0.2))
        if not 0.0 <= self.wall_frac < 0.5:
            raise ValueError(f"gridnav 'walls' must be in [0, 0.5), got {self.wall_frac}")
        self.shaping = float(md.get("shaping", 0.0))
        self.start = self._layout(md)
        self.expert = self._solve(self.start)
        self.max_steps = int_param(md, "max_steps", 2 * len(self.expert) + 4, 1)
        self.state, self.steps, self.done = None, 0, True

    def _layout(self, md: dict):
        min_dist = int_param(md, "min_dist", 1, 1)
        max_dist = int_param(md, "max_dist", max(self.size * self.size, min_dist), min_dist)
        # A string seed goes through sha512 in random.Random: the same metadata gives the same task in every
        # process. Rejection sampling gives up with a clear error when the bounds cannot be met.
        rng = random.Random(":".join(map(str, ["gridnav", self.seed, self.size, self.wall_frac, min_dist, max_dist])))
        cells = [(x, y) for y in range(self.size) for x in range(self.size)]
        n_walls = int(round(self.wall_frac * len(cells)))
        for _ in range(_MAX_LAYOUT_TRIES):
            picked = rng.sample(cells, n_walls + 2)
            self.walls = frozenset(picked[2:])
            start, self.goal = picked[0], picked[1]
            self.dist = self._bfs_from(self.goal)
            if min_dist <= self.dist.get(start, -1) <= max_dist:
                return start
        raise ValueError(
            f"gridnav: no layout with optimal length in [{min_dist}, {max_dist}] for size {self.size}, "
            f"walls {self.wall_frac} after {_MAX_LAYOUT_TRIES} tries; loosen min_dist/max_dist or grow size"
        )

    def _bfs_from(self, origin):
        dist = {origin: 0}
        queue = deque([origin])
        while queue:
            cell = queue.popleft()
            for nxt in self._neighbours(cell).values():
                if nxt not in dist:
                    dist[nxt] = dist[cell] + 1
                    queue.append(nxt)
        return dist

    def _neighbours(self, cell):
        out = {}
        for name, (dx, dy) in MOVES.items():
            nxt = (cell[0] + dx, cell[1] + dy)
            if 0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size and nxt not in self.walls:
                out[name] = nxt
        return out

    def _solve(self, cell):
        plan = []
        while self.dist[cell] > 0:
            # First neighbour (in MOVES order) one step closer to the goal: a shortest path.
            move, cell = next(
                (m, c) for m, c in self._neighbours(cell).items() if self.dist.get(c) == self.dist[cell] - 1
            )
            plan.append(move)
        return plan

    def _observe(self, cell):
        text = f"at {cell[0]},{cell[1]} goal {self.goal[0]},{self.goal[1]}"
        blocked = [m for m in MOVES if m not in self._neighbours(cell)]
        return f"{text} wall:{','.join(blocked)}" if blocked else text

    def reset(self):
        self.state, self.steps, self.done = self.start, 0, False
        lines = [f"Grid {self.size}x{self.size}. Reach the goal. Actions: {ACTIONS}."]
        if self.walls:
            lines.append("Map (# wall, S start, G goal):")
            for y in range(self.size):
                marks = {**dict.fromkeys(self.walls, "#"), self.start: "S", self.goal: "G"}
                lines.append("".join(marks.get((x, y), ".") for x in range(self.size)))
        return "\n".join([*lines, self._observe(self.start)]), {}

    def step(self, response_text: str):
        if self.done:
            raise RuntimeError("gridnav: step() called before reset() or after the episode ended")
        self.steps += 1
        info = {"invalid_action": False, "success": False, "steps": self.steps, "reward": 0.0}
        action = reply_action(response_text)
        words = (action or "").strip().splitlines()
        move = " ".join(words[0].lower().split()) if words else ""  # models add spaces, newlines, capitals
        if action is None:
            info["invalid_action"] = True
            observation = (
                f"No action: the reply ended inside {THINK_OPEN}. Think briefly, close with {THINK_CLOSE}, "
                f"then give one action: {ACTIONS}"
            )
        elif move not in MOVES:
            info["invalid_action"] = True
            observation = f"Invalid action '{action.strip()[:40]}'. Valid actions: {ACTIONS}"
        elif move not in self._neighbours(self.state):  # a wall or the grid's edge
            info["invalid_action"] = True
            observation = f"Blocked {move}. {self._observe(self.state)}"
        else:
            before, self.state = self.dist[self.state], self._neighbours(self.state)[move]
            info["reward"] += self.shaping * (before - self.dist[self.state])
            observation = self._observe(self.state)
        if self.dist[self.state] == 0:
            info["success"], info["reward"], self.done = True, info["reward"] + 1.0, True
            observation = f"{observation} solved"
        elif self.steps >= self.max_steps:
            info["out_of_steps"], self.done = True, True
            observation = f"{observation} out of steps"
        return observation, self.done, info

    def format_observation(self, observation: str) -> dict:
        return {"role": "user", "content": observation}

    def close(self) -> None:
        self.state, self.done = None, True

    def expert_actions(self) -> list[str]:
        """The optimal action sequence from the reset state (TCOD's B2F prefix)."""
        return list(self.expert)


def build_env(sample, args):
    """``build_env(sample, args)`` for ``rollout_interaction_env_path: examples.multi_turn_tcod.envs.gridnav``."""
    return GridNavEnv(sample.metadata or {})


def task_metadata(seed: int, params: dict) -> dict:
    """The metadata of task number ``seed`` for ``make_data`` (the parameters its command line gives)."""
    keys = ("size", "walls", "min_dist", "max_dist", "max_steps", "shaping")
    return {"env": "gridnav", "seed": seed, **{k: params[k] for k in keys if params.get(k) is not None}}
