"""Towers of Hanoi on pegs A, B, C: gather all disks on the target peg, never a larger on a smaller.

Task metadata: ``{"env": "hanoi", "seed": int, "disks": int (1..9, default 3), "start": "random"
(each disk on a random peg, the default) | "tower" (all disks on one peg: exactly 2**disks - 1 optimal
moves), "min_dist"/"max_dist": optional bounds on the optimal length, "max_steps", "shaping"}``.

Pegs are shown bottom to top, e.g. ``A:321 B: C:`` (disk 3 is the largest); the action is
``move X Y``. The expert is the classic recursion, optimal from any legal position: if the largest
disk not yet home must move, first park every smaller disk on the spare peg.
"""

from __future__ import annotations

from examples.agent_envs.puzzle import PuzzleEnv, int_param, pick_params, sample_metadata, task_rng

PEGS = "ABC"
_MAX_LAYOUT_TRIES = 2000


def optimal_moves(pos: list[int], target: int) -> list[tuple[int, int]]:
    """Optimal (from_peg, to_peg) moves that stack every disk on ``target``.

    ``pos[d]`` is the peg of disk d (1 = smallest; index 0 unused). Disks above the largest one that
    has to move are first gathered on the third peg, which frees both its source and the target.
    """
    pos = list(pos)
    moves: list[tuple[int, int]] = []

    def gather(k: int, peg: int) -> None:
        if k == 0:
            return
        if pos[k] == peg:
            gather(k - 1, peg)
            return
        spare = 3 - pos[k] - peg
        gather(k - 1, spare)
        moves.append((pos[k], peg))
        pos[k] = peg
        gather(k - 1, peg)

    gather(len(pos) - 1, target)
    return moves


class HanoiEnv(PuzzleEnv):
    name = "hanoi"
    valid_actions_hint = "move X Y with X, Y in A B C"

    def _initial_state(self):
        md = self.metadata
        self.disks = int_param(md, "disks", 3, 1, 9)
        self.seed = int_param(md, "seed", None, 0)
        self.start_kind = md.get("start", "random")
        if self.start_kind not in ("random", "tower"):
            raise ValueError(f"hanoi 'start' must be 'random' or 'tower', got {self.start_kind!r}")
        min_dist = int_param(md, "min_dist", 1, 1)
        max_dist = int_param(md, "max_dist", max(2 ** self.disks - 1, min_dist), min_dist)
        rng = task_rng(self.name, self.seed, self.disks, self.start_kind, min_dist, max_dist)
        for _ in range(_MAX_LAYOUT_TRIES):
            self.target = rng.randrange(3)
            if self.start_kind == "tower":
                source = rng.choice([p for p in range(3) if p != self.target])
                pos = (0,) + (source,) * self.disks
            else:
                pos = (0,) + tuple(rng.randrange(3) for _ in range(self.disks))
            if min_dist <= len(optimal_moves(list(pos), self.target)) <= max_dist:
                return pos
        raise ValueError(f"hanoi: no start with optimal length in [{min_dist}, {max_dist}] for "
                         f"{self.disks} disks (the most is {2 ** self.disks - 1})")

    # --------------------------------------------------------------- puzzle hooks
    def _parse(self, action):
        parts = action.split()
        if len(parts) != 3 or parts[0] != "move" or any(p not in ("a", "b", "c") for p in parts[1:]):
            return None
        src, dst = "abc".index(parts[1]), "abc".index(parts[2])
        return (src, dst) if src != dst else None

    def _top(self, pos, peg):
        # The smallest disk on a peg is the one on top; 0 means the peg is empty.
        return next((d for d in range(1, len(pos)) if pos[d] == peg), 0)

    def _apply(self, pos, move):
        src, dst = move
        disk, under = self._top(pos, src), self._top(pos, dst)
        if disk == 0:
            return f"Illegal: {PEGS[src]} is empty"
        if under and under < disk:
            return f"Illegal: {disk} on {under}"
        new = list(pos)
        new[disk] = dst
        return tuple(new)

    def _distance(self, pos):
        return len(optimal_moves(list(pos), self.target))

    def _solve(self, pos):
        return [f"move {PEGS[a]} {PEGS[b]}" for a, b in optimal_moves(list(pos), self.target)]

    def _observe(self, pos):
        # Bottom to top = largest to smallest disk on each peg.
        return " ".join(
            f"{PEGS[p]}:" + "".join(str(d) for d in range(len(pos) - 1, 0, -1) if pos[d] == p) for p in range(3)
        )

    def _describe(self, pos):
        return (f"Hanoi, {self.disks} disks. Stack all on {PEGS[self.target]}, never larger on smaller. "
                f"Action: move X Y.\n{self._observe(pos)}")


def build_env(sample=None, args=None):
    """Upstream's environment hook: ``rollout_interaction_env_path: examples.agent_envs.hanoi``."""
    del args
    return HanoiEnv(sample_metadata(sample))


def task_metadata(seed: int, params: dict) -> dict:
    """The metadata of task number ``seed`` for the data generator (params from its command line)."""
    return pick_params("hanoi", seed, params, ("disks", "start", "min_dist", "max_dist", "max_steps", "shaping"))
