"""TCOD's temporal curriculum (arXiv:2604.24005): how deep into a trajectory the student trains at step n.

Pure functions of the rollout id n, so a resumed run continues the schedule exactly. With
``k_start = 1``, ``eta`` = the official ``checkpoint_steps`` and ``k_max`` = ``max_env_steps`` they
reproduce the official code (github.com/kokolerk/TCOD):

* F2B plays turns 1..k(n) from reset, ``k(n) = min(k_start + n // eta, k_max)``;
* B2F replays ``max(0, L_exp - k(n))`` expert turns, then the student plays to the end.

The agent loop (``examples/multi_turn_tcod/rollout.py``) asks :func:`episode_plan` for the current
rollout id, which ``RolloutManager`` keeps in ``slime.rollout.sample_hooks``. The official prefix
``max(0, (L_exp - 1) - n // eta)`` is not capped by ``k_max``; ours is, through the depth, so an expert
path longer than ``k_max`` keeps its last ``k_max`` turns in reach.
"""


def curriculum_depth(step: int, k_start: int, eta: int, k_max: int) -> int:
    """Student turns exposed at rollout ``step``: grows by one every ``eta`` steps up to ``k_max``."""
    if step < 0 or k_start < 1 or eta < 1 or k_max < k_start:
        raise ValueError(
            f"TCOD schedule needs step >= 0, k_start >= 1, eta >= 1, k_max >= k_start; got "
            f"step={step}, k_start={k_start}, eta={eta}, k_max={k_max}"
        )
    return min(k_start + step // eta, k_max)


def b2f_prefix_length(expert_len: int | None, depth: int) -> int:
    """Expert turns B2F replays before the student plays ``depth`` turns (0 without expert actions)."""
    return max(0, expert_len - depth) if expert_len else 0


def episode_plan(args, rollout_id: int | None, evaluation: bool = False) -> dict:
    """How one episode of rollout ``rollout_id`` is played: ``mode`` full / f2b / b2f, ``depth``, the
    student's turn limit and the ``step`` (evaluation and vanilla OPD play full episodes)."""
    if evaluation or not getattr(args, "use_tcod", False):
        return {"mode": "full", "max_student_turns": args.max_turns, "step": rollout_id}
    if rollout_id is None:
        raise RuntimeError("--use-tcod: no current rollout id (slime.rollout.sample_hooks.set_current_rollout_id)")
    depth = curriculum_depth(rollout_id, args.tcod_k_start, args.tcod_eta, args.tcod_k_max)
    turns = depth if args.tcod_mode == "f2b" else args.max_turns
    return {"mode": args.tcod_mode, "depth": depth, "max_student_turns": turns, "step": rollout_id}
