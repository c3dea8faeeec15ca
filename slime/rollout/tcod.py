"""TCOD's temporal curriculum (arXiv:2604.24005): how deep into a trajectory the student trains at step n.

Pure functions of the rollout id n, so a resumed run continues the schedule exactly. With
``k_start = 1``, ``eta`` = the official ``checkpoint_steps`` and ``k_max`` = ``max_env_steps`` they
reproduce the official code:

* F2B plays turns 1..k(n) from reset, ``k(n) = min(k_start + n // eta, k_max)``;
* B2F replays ``max(0, L_exp - k(n))`` expert turns, then the student plays to the end.

``--rollout-function-path slime.rollout.tcod.generate_rollout`` wraps the default ``generate_rollout``
and attaches each step's plan to the samples as the data source hands them out; the agent loop
(``examples/multi_turn_tcod/rollout.py``) reads it.

The official prefix ``max(0, (L_exp - 1) - n // eta)`` is not capped by ``k_max``; ours is, through the
depth, so an expert path longer than ``k_max`` keeps its last ``k_max`` turns in reach. The two agree
whenever ``L_exp <= k_max``.
"""


def _check(step: int, k_start: int, eta: int, k_max: int) -> None:
    if step < 0:
        raise ValueError(f"TCOD step must be >= 0, got {step}")
    if k_start < 1:
        raise ValueError(f"TCOD k_start must be >= 1, got {k_start}")
    if eta <= 0:
        raise ValueError(f"TCOD eta must be > 0, got {eta}")
    if k_max < k_start:
        raise ValueError(f"TCOD k_max ({k_max}) must be >= k_start ({k_start})")


def curriculum_depth(step: int, k_start: int, eta: int, k_max: int) -> int:
    """Student turns exposed at rollout ``step``: grows by one every ``eta`` steps up to ``k_max``."""
    _check(step, k_start, eta, k_max)
    return min(k_start + step // eta, k_max)


def b2f_prefix_length(step: int, expert_len: int | None, k_start: int, eta: int, k_max: int) -> int:
    """Expert turns to replay before the student plays at ``step`` (0 without expert actions)."""
    depth = curriculum_depth(step, k_start, eta, k_max)
    if not expert_len or expert_len <= 0:
        return 0
    return max(0, expert_len - depth)


# ---------------------------------------------------------------------------- episode plans
# The rollout function knows the step n; slime's generate signature does not carry it. So the step's
# plan is written into ``sample.metadata["episode_plan"]`` and the multi-turn generate function reads it.
# The step lives in the plan, not in ``Sample.rollout_id``: upstream uses that field to group the
# training samples of one rollout execution for loss aggregation.
def episode_plan(args, rollout_id: int, evaluation: bool = False) -> dict | None:
    """The plan for every sample of rollout ``rollout_id`` (None for single-turn rollouts)."""
    max_turns = getattr(args, "max_turns", None)
    if not max_turns:
        return None
    if evaluation or not getattr(args, "use_tcod", False):
        # Evaluation always plays full episodes; vanilla multi-turn OPD too.
        return {"mode": "full", "max_student_turns": max_turns, "step": rollout_id}
    depth = curriculum_depth(rollout_id, args.tcod_k_start, args.tcod_eta, args.tcod_k_max)
    if args.tcod_mode == "f2b":
        return {"mode": "f2b", "depth": depth, "max_student_turns": depth, "step": rollout_id}
    return {
        "mode": "b2f",
        "depth": depth,
        "max_student_turns": max_turns,
        "step": rollout_id,
        "prefix_source": getattr(args, "tcod_prefix_source", None) or "expert",
    }


def attach_plan(args, rollout_id: int, sample, evaluation: bool = False) -> None:
    plan = episode_plan(args, rollout_id, evaluation)
    if plan is not None:
        sample.metadata["episode_plan"] = plan


# ---------------------------------------------------------------------------- the rollout function
class PlannedDataSource:
    """The run's data source, attaching rollout ``rollout_id``'s plan to every sample it hands out.

    Upstream's ``generate_rollout`` pulls samples through ``data_source.get_samples`` (more than once
    when it over-samples); everything else (``add_samples``, ``save``, ...) goes to the real source.
    A sample handed back and out again (partial rollouts) gets the current step's plan.
    """

    def __init__(self, data_source, args, rollout_id: int):
        self._source = data_source
        self._args = args
        self._rollout_id = rollout_id

    def get_samples(self, num_samples: int):
        groups = self._source.get_samples(num_samples)
        for group in groups:
            for sample in group:
                attach_plan(self._args, self._rollout_id, sample)
        return groups

    def __getattr__(self, name):
        return getattr(self._source, name)


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """slime's rollout-function hook: the default rollout, with TCOD's plan for step ``rollout_id``.

    Evaluation goes to the default rollout untouched: the agent loop plays full episodes there.
    """
    # Imported here so that the schedule above imports without the rollout stack (sglang, ray).
    from slime.rollout.sglang_rollout import generate_rollout as default_generate_rollout

    if evaluation:
        return default_generate_rollout(args, rollout_id, data_source, evaluation=True)
    return default_generate_rollout(
        args, rollout_id, PlannedDataSource(data_source, args, rollout_id), evaluation=False
    )
