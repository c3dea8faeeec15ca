"""TCOD's temporal curriculum (arXiv:2604.24005): how deep into a trajectory the student trains at step n.

Pure functions of the rollout id n, so a resumed run continues the schedule exactly. With
``k_start = 1``, ``eta`` = the official ``checkpoint_steps`` and ``k_max`` = ``max_env_steps`` they
reproduce the official code (github.com/kokolerk/TCOD):

* F2B plays turns 1..k(n) from reset, ``k(n) = min(k_start + n // eta, k_max)``;
* B2F replays ``max(0, L_exp - k(n))`` expert turns, then the student plays on; as the official
  ``range(start_step, max_env_steps)``, replayed and student turns together are at most ``max_turns``.

A generate function (``examples/multi_turn_tcod/rollout.py``) asks :func:`episode_plan` for the current
rollout id, which ``RolloutManager`` keeps in ``slime.rollout.sample_hooks``; ``--use-tcod`` adds
:func:`check_episode_planned` to ``--rollout-sample-hook-path``. The official prefix
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


def episode_plan(args, rollout_id: int | None, max_turns: int, evaluation: bool = False) -> dict:
    """How one episode of rollout ``rollout_id`` is played by a generate function whose episodes take at most
    ``max_turns`` turns: ``mode`` full / f2b / b2f, ``depth``, ``max_turns`` (the episode's environment steps,
    replayed ones included) and the ``step`` (evaluation and vanilla OPD play full episodes)."""
    if evaluation or not getattr(args, "use_tcod", False):
        return {"mode": "full", "max_turns": max_turns, "step": rollout_id}
    if rollout_id is None:
        raise RuntimeError("--use-tcod: no current rollout id (slime.rollout.sample_hooks.set_current_rollout_id)")
    k_max = args.tcod_k_max or max_turns
    if k_max > max_turns:
        raise ValueError(f"--tcod-k-max ({k_max}) must be <= the episode's max_turns ({max_turns}).")
    depth = curriculum_depth(rollout_id, args.tcod_k_start, args.tcod_eta, k_max)
    turns = depth if args.tcod_mode == "f2b" else max_turns  # B2F: the prefix counts towards max_turns
    return {"mode": args.tcod_mode, "depth": depth, "max_turns": turns, "step": rollout_id}


def check_episode_planned(args, sample, rollout_id=None, evaluation=False):
    """``--rollout-sample-hook-path`` hook: under ``--use-tcod`` a training sample must carry its rollout's plan."""
    plan = (sample.metadata or {}).get("episode_plan") or {}
    if not evaluation and plan.get("step") != rollout_id:
        generate = getattr(sample, "generate_function_path", None) or args.custom_generate_function_path  # as run
        raise RuntimeError(
            f"--use-tcod: {generate} did not play TCOD's curriculum for rollout "
            f"{rollout_id} (no metadata['episode_plan'] from slime.rollout.tcod.episode_plan); use a generate "
            "function that does, e.g. examples.multi_turn_tcod.rollout.generate."
        )
