"""Grid navigation: walk from a start cell to a goal cell in a square grid with walls.

Task metadata: ``{"env": "gridnav", "seed": int, "size": int (2..20), "walls": float in [0, 0.5)
(fraction of wall cells, default 0.2), "min_dist"/"max_dist": optional bounds on the optimal path
length, "max_steps": optional (default 2 * optimal + 4), "shaping": optional per-step shaping}``.

Coordinates are ``x,y`` with x growing right and y growing down, so ``up`` decreases y. Observations
are short to keep long episodes within the context: the first one shows the task, the
map (when there are walls) and ``at X,Y goal X,Y``; later ones show the position, the goal and the
blocked neighbours, e.g. ``at 2,3 goal 4,4 wall:up,left``. The expert is a BFS shortest path that
prefers horizontal moves, so without walls it walks along x first, then y.
"""

from __future__ import annotations

from collections import deque

from .common import PuzzleEnv, int_param, pick_params, sample_metadata, task_rng

MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # order = expert tie-break
blocking = False  # build_env is cheap: the agent loop calls it on the event loop
_MAX_LAYOUT_TRIES = 2000


class GridNavEnv(PuzzleEnv):
    name = "gridnav"
    valid_actions_hint = "up down left right"

    def _initial_state(self):
        md = self.metadata
        self.size = int_param(md, "size", 5, 2, 20)
        self.seed = int_param(md, "seed", None, 0)
        self.wall_frac = float(md.get("walls", 0.2))
        if not 0.0 <= self.wall_frac < 0.5:
            raise ValueError(f"gridnav 'walls' must be in [0, 0.5), got {self.wall_frac}")
        min_dist = int_param(md, "min_dist", 1, 1)
        max_dist = int_param(md, "max_dist", max(self.size * self.size, min_dist), min_dist)
        rng = task_rng(self.name, self.seed, self.size, self.wall_frac, min_dist, max_dist)
        cells = [(x, y) for y in range(self.size) for x in range(self.size)]
        n_walls = int(round(self.wall_frac * len(cells)))
        # Rejection sampling with one rng stream: deterministic, and it gives up with a clear error
        # when the bounds cannot be met (e.g. min_dist larger than any path in the grid).
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

    # --------------------------------------------------------------- puzzle hooks
    def _parse(self, action):
        return action if action in MOVES else None

    def _apply(self, state, move):
        nxt = self._neighbours(state).get(move)
        return nxt if nxt is not None else f"Blocked {move}"

    def _distance(self, state):
        return self.dist[state]

    def _solve(self, state):
        plan = []
        while self.dist[state] > 0:
            # First neighbour (in MOVES order) one step closer to the goal: a shortest path.
            move, state = next(
                (m, c) for m, c in self._neighbours(state).items() if self.dist.get(c, -1) == self.dist[state] - 1
            )
            plan.append(move)
        return plan

    def _observe(self, state):
        text = f"at {state[0]},{state[1]} goal {self.goal[0]},{self.goal[1]}"
        blocked = [m for m in MOVES if m not in self._neighbours(state)]
        return f"{text} wall:{','.join(blocked)}" if blocked else text

    def _describe(self, state):
        lines = [f"Grid {self.size}x{self.size}. Reach the goal. Actions: up down left right."]
        if self.walls:
            lines.append("Map (# wall, S start, G goal):")
            for y in range(self.size):
                row = "".join(
                    "#" if (x, y) in self.walls else "S" if (x, y) == state else "G" if (x, y) == self.goal else "."
                    for x in range(self.size)
                )
                lines.append(row)
        lines.append(self._observe(state))
        return "\n".join(lines)


def build_env(sample=None, args=None):
    """``build_env(sample, args)`` for ``rollout_interaction_env_path: examples.multi_turn_tcod.envs.gridnav``."""
    del args
    return GridNavEnv(sample_metadata(sample))


def task_metadata(seed: int, params: dict) -> dict:
    """The metadata of task number ``seed`` for the data generator (params from its command line)."""
    return pick_params("gridnav", seed, params, ("size", "walls", "min_dist", "max_dist", "max_steps", "shaping"))
