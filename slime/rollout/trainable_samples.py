"""Which of a rollout's samples the trainer sees: failed, aborted and removed episodes are dropped.

The rollout layer owns this rule because it is a property of the samples a rollout produces, and both
``RolloutManager`` (``slime.ray.rollout``, which filters every step) and ``--turns-per-step``
(``turn_budget``, which counts the turns a step will train while it draws episodes) must apply the same
one. It lives here, below ``slime.ray``, so the rollout layer never imports the layer above it.
"""

from __future__ import annotations

from slime.utils.types import Status

# Advantage estimators that normalise within a prompt's group: a group missing a sample is dropped whole.
_GROUP_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")


class TooManyFailures(RuntimeError):
    """Most of a rollout batch failed: training on what is left would be training on nothing."""


def trainable(sample) -> bool:
    if sample.status in (Status.FAILED, Status.ABORTED):
        return False
    if sample.remove_sample:  # upstream's flag: failed episodes, finished B2F replays
        return False
    return sample.response_length > 0 and (sample.loss_mask is None or sum(sample.loss_mask) > 0)


def select_trainable(args, groups) -> tuple[list, dict]:
    """Flatten groups, keeping only trainable samples; group estimators drop whole incomplete groups.

    Aborted episodes (the rollout stopped generation: ``GenerateState.aborted``) are dropped like failed
    ones and counted apart: they do not count towards :class:`TooManyFailures`. A request the engine
    aborted on its own fails its episode (``FAILED``, outcome ``engine_abort``) and counts as a failure.
    """
    group_estimator = args.advantage_estimator in _GROUP_ESTIMATORS and args.n_samples_per_prompt > 1
    kept, dropped, failed, aborted = [], 0, 0, 0
    for group in groups:
        ok = [trainable(s) for s in group]
        failed += sum(s.status == Status.FAILED for s in group)
        aborted += sum(s.status == Status.ABORTED for s in group)
        if group_estimator and not all(ok):
            dropped += len(group)
            continue
        kept.extend(s for s, good in zip(group, ok) if good)
        dropped += len(group) - sum(ok)
    total = sum(len(g) for g in groups)
    if failed and failed * 2 > total:
        reasons = sorted({str(s.metadata.get("error", "?"))[:200] for g in groups for s in g
                          if s.status == Status.FAILED})[:3]
        raise TooManyFailures(f"{failed} of {total} samples failed in this rollout (e.g. {reasons}); "
                              "stopping instead of training on what is left")
    return kept, {"rollout/failed": failed, "rollout/aborted": aborted, "rollout/dropped": dropped,
                  "rollout/kept": len(kept)}
