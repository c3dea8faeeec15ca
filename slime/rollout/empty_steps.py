"""Steps whose samples were all removed: skipped with one line, and the run stopped after several in a row.

A rollout can leave nothing to train on: every B2F episode's replayed prefix filled the response budget,
every replay finished the task before the student's turn, every environment failed, or a group estimator
dropped every group. Such a step is not trained (the trainer needs samples); the driver logs it and goes
on, since a later step (a shorter B2F prefix, a new batch of tasks) may fit. ``EMPTY_STEPS_LIMIT`` such
steps in a row stop the run with the likely cause and the flag to change (``EmptyStepsError``).
"""

from __future__ import annotations

from collections import Counter

from slime.utils.types import Status

EMPTY_STEPS_LIMIT = 3


class EmptyStepsError(RuntimeError):
    """Several steps in a row had no trainable sample; the message is the line for the user."""


def _flag(args, name: str) -> str:
    return f"--{name.replace('_', '-')} {getattr(args, name, None)}"


def _budget_met(args, sample) -> str:
    """Which limit a trajectory cut for room met: the response budget or the context length."""
    response_room = args.rollout_max_response_len - sample.response_length
    context = getattr(args, "rollout_max_context_len", None)
    if context is not None and context - len(sample.tokens or []) < response_room:
        return _flag(args, "rollout_max_context_len")
    return _flag(args, "rollout_max_response_len")


def removal_reason(args, sample, group_dropped: bool = False) -> tuple[str, str, str]:
    """``(reason, the budget or flag it met, what to change)`` for a sample that was not trained."""
    outcome = (sample.metadata or {}).get("outcome")
    if outcome == "engine_abort":
        return "the engine aborted the request", "the rollout engines", "see the engines' logs"
    if sample.status == Status.FAILED or outcome == "env_error":
        return ("the environment failed", _flag(args, "env_step_timeout"),
                "fix the environment (its warnings are above) or raise --env-step-timeout")
    if sample.status == Status.ABORTED:
        return "the episode was aborted", "the rollout engines", "see the engines' logs"
    if outcome == "context_full":
        budget = _budget_met(args, sample)
        return "the trajectory filled its budget before a student turn", budget, f"raise {budget.split()[0]}"
    if outcome == "prompt_too_long":
        return ("the prompt did not fit the context", _flag(args, "rollout_max_context_len"),
                "raise --rollout-max-context-len or shorten the prompts")
    if outcome == "replay_finished":
        depth = ((sample.metadata or {}).get("episode_plan") or {}).get("depth")
        return ("the B2F replay finished the task before the student's turn",
                f"curriculum depth {depth}, {_flag(args, 'tcod_k_start')}", "raise --tcod-k-start")
    if group_dropped:
        return ("another sample of its group was removed", _flag(args, "n_samples_per_prompt"),
                "fix what removed the others (the other reasons of this line)")
    return ("it had no student token", _flag(args, "max_turn_response_len"), "raise --max-turn-response-len")


def describe_removed(args, groups, trainable) -> tuple[int, tuple[str, str, str], int]:
    """``(removed, the commonest (reason, budget, fix), how many had it)`` over the step's ``groups``."""
    reasons = Counter()
    for group in groups:
        ok = [trainable(s) for s in group]
        for sample, good in zip(group, ok):
            if not good:
                reasons[removal_reason(args, sample)] += 1
            elif not all(ok):  # trainable itself, dropped with its group
                reasons[removal_reason(args, sample, group_dropped=True)] += 1
    if not reasons:
        return 0, ("no sample was generated", "--rollout-batch-size", "check --prompt-data"), 0
    commonest, count = reasons.most_common(1)[0]
    return sum(reasons.values()), commonest, count


class EmptySteps:
    """Counts consecutive skipped steps: ``skip`` gives a step's line and metrics, ``stop_if_too_many`` raises."""

    def __init__(self, args, trainable, limit: int = EMPTY_STEPS_LIMIT):
        self.args, self.trainable, self.limit = args, trainable, limit
        self.in_a_row = 0

    def trained(self) -> None:
        self.in_a_row = 0

    def skip(self, rollout_id: int, groups) -> tuple[str, dict]:
        """The skipped step's line and metrics; the caller logs them, then calls ``stop_if_too_many``."""
        removed, (reason, budget, fix), count = describe_removed(self.args, groups, self.trainable)
        self.in_a_row += 1
        self.last = (rollout_id, removed, reason, budget, fix, count)
        line = (f"step {rollout_id} skipped: all {removed} samples removed, {count} because {reason} ({budget}); "
                f"no update ({self.in_a_row} in a row; {self.limit} stop the run)")
        return line, {"rollout/skipped": 1, "rollout/removed": removed}

    def stop_if_too_many(self) -> None:
        if self.in_a_row < self.limit:
            return
        rollout_id, removed, reason, budget, fix, count = self.last
        raise EmptyStepsError(
            f"{self.in_a_row} steps in a row (the last: {rollout_id}) had every sample removed, most often "
            f"because {reason} ({count} of {removed}, {budget}): {fix}")
