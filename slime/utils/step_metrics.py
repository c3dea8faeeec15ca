"""Rollout-side metrics of one step, including multi-turn OPD diagnostics (TCOD paper).

* per-turn KL by turn index: for every student turn, the sum over its tokens of
  ``log p_student - log p_teacher``, averaged over the trajectories that reached that turn. The turn
  index counts episode turns, so in B2F the first student turn after a prefix of p replayed turns has
  index p (0-based).
* trajectory KL: the same sum over all student tokens of a trajectory; mean and std over the batch.
* turn-KL slopes (``opd/turn_kl_slopes``): for every trained episode with at least 3 student turns, the
  least-squares slope of its per-token mean KL per turn against the turn index. TCOD's premise is that
  vanilla OPD's KL grows with depth (the student drifts from the teacher's support); a slope taken within
  each episode is not faked by only the failing episodes reaching late turns (``benchmarks/tcod_premise.py``).
"""

from __future__ import annotations

import logging
import math

from slime.utils.types import Sample

logger = logging.getLogger(__name__)
# Above this share of student turns cut before their end-of-turn token, the turn limit is too small
# for the environment's actions (a temperature-1 student rambling now and then stays far below it).
CUT_TURNS_WARN_FRACTION = 0.5
_warned_cut_turns = False


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _std(values):
    values = list(values)
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def per_turn_kl(samples, per_sample_kl) -> tuple[list[float], list[float]]:
    """(mean KL per episode turn index, trajectory KL per sample) from per-token OPD KL lists."""
    by_turn: dict[int, list[float]] = {}
    trajectory = []
    for sample, kl in zip(samples, per_sample_kl):
        mask = sample.loss_mask or [1] * sample.response_length
        trajectory.append(sum(float(k) * m for k, m in zip(kl, mask)))
        offset = int(sample.metadata.get("prefix_turns", 0))
        for j, (start, end) in enumerate(sample.metadata.get("turn_spans", [])):
            turn_sum = sum(float(kl[t]) * mask[t] for t in range(start, end))
            by_turn.setdefault(offset + j, []).append(turn_sum)
    if not by_turn:
        return [], trajectory
    width = max(by_turn) + 1
    return [_mean(by_turn.get(i, [])) if i in by_turn else None for i in range(width)], trajectory


MIN_TURNS_FOR_SLOPE = 3


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = _mean(xs), _mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def turn_kl_slopes(samples, per_sample_kl) -> list[float]:
    """Per episode, the slope of the per-token mean KL of each student turn against its turn index."""
    slopes = []
    for sample, kl in zip(samples, per_sample_kl):
        mask = sample.loss_mask or [1] * sample.response_length
        offset = int(sample.metadata.get("prefix_turns", 0))
        points = []
        for j, (start, end) in enumerate(sample.metadata.get("turn_spans", [])):
            trained = sum(mask[start:end])
            if trained:
                points.append((offset + j, sum(float(kl[t]) * mask[t] for t in range(start, end)) / trained))
        if len(points) >= MIN_TURNS_FOR_SLOPE:
            slopes.append(_slope([p[0] for p in points], [p[1] for p in points]))
    return slopes


# Episodes that did not run to an end of their own: a failed environment, an aborted generation.
UNFINISHED = (Sample.Status.FAILED, Sample.Status.ABORTED)


def turns_without_stop_fraction(samples) -> float | None:
    """Share of the student turns of finished episodes that ended without their end-of-turn token."""
    finished = [s for s in samples if "num_turns" in s.metadata and s.status not in UNFINISHED]
    turns = sum(s.metadata["num_turns"] for s in finished)
    if not turns:
        return None
    return sum(s.metadata.get("turns_without_stop", 0) for s in finished) / turns


def warn_if_turns_cut(args, fraction: float | None, where: str) -> None:
    """Warn once per process when most turns are cut: the next contexts then lack the end-of-turn token
    the chat layout (and SFT on expert turns) puts after each action, so the policy reads text it was
    never trained on. hanoi's 9-token actions under a limit of 8 looked like an incompetent teacher."""
    global _warned_cut_turns
    if fraction is None or fraction <= CUT_TURNS_WARN_FRACTION or _warned_cut_turns:
        return
    _warned_cut_turns = True
    logger.warning("%s: %.0f%% of student turns ended without the end-of-turn token (cut at "
                   "--max-turn-response-len %s or the response budget). If the environment's actions need "
                   "that many tokens, raise --max-turn-response-len.", where, 100 * fraction,
                   getattr(args, "max_turn_response_len", None))


PREFIX_SOURCES = ("expert", "teacher_cached", "teacher_live")


def prefix_source_metrics(samples) -> dict:
    """B2F: how many episodes got their prefix from each source, and how many fell back to vanilla.

    A sample counts under a source only when at least one turn was replayed from it (at full depth the
    prefix is empty and nothing is counted); ``prefix_fallback`` counts the episodes whose task had no
    prefix to give (no expert actions, or a teacher that failed the task); ``teacher_episodes`` the
    teacher episodes played this step (cache misses: the teacher-prefix cost).
    """
    out = {f"tcod/prefix_source_{name}": sum(1 for s in samples if s.metadata.get("prefix_source") == name)
           for name in PREFIX_SOURCES}
    out["tcod/prefix_fallback"] = sum(1 for s in samples if s.metadata.get("prefix_fallback"))
    out["tcod/teacher_episodes"] = sum(1 for s in samples if s.metadata.get("teacher_episode_played"))
    return out


def rollout_metrics(args, groups, samples, train_stats: dict) -> dict:
    """Metrics of the generated groups (all samples) and of the trained ones (``samples``)."""
    everything = [s for g in groups for s in g]
    out = {
        "rollout/reward": _mean(s.metadata.get("task_reward", 0.0) for s in everything
                                if s.status not in UNFINISHED),
        "rollout/response_len": _mean(s.response_length for s in everything),
        "rollout/truncated": _mean(float(s.status == Sample.Status.TRUNCATED) for s in everything),
        "rollout/trained_tokens": sum(s.effective_response_length for s in samples),
        "rollout/trained_tokens_per_traj": _mean(s.effective_response_length for s in samples),
    }
    multi = [s for s in everything if "num_turns" in s.metadata]
    if multi:
        finished = [s for s in multi if s.status not in UNFINISHED]
        out["multi_turn/success_rate"] = _mean(float(bool(s.metadata.get("success"))) for s in finished)
        out["multi_turn/turns"] = _mean(s.metadata["num_turns"] for s in finished)
        # What the step trained on: with --turns-per-step the episode count varies, the turn count not.
        out["rollout/episodes"] = len(everything)
        out["rollout/student_turns"] = sum(s.metadata.get("num_turns", 0) for s in samples)
        cut = turns_without_stop_fraction(finished)
        out["multi_turn/turns_without_stop"] = cut or 0.0
        warn_if_turns_cut(args, cut, "rollout")
        out["multi_turn/cut"] = sum(1 for s in finished if s.metadata.get("outcome") == "cut")
        out["multi_turn/replay_finished"] = sum(1 for s in everything if s.metadata.get("outcome") == "replay_finished")
        out["multi_turn/env_failed"] = sum(1 for s in multi if s.status == Sample.Status.FAILED)
        out["multi_turn/aborted"] = sum(1 for s in multi if s.status == Sample.Status.ABORTED)
        plans = [s.metadata.get("episode_plan") or {} for s in multi]
        if any("depth" in p for p in plans):
            out["tcod/depth"] = max(p.get("depth", 0) for p in plans)
        out["tcod/prefix_len"] = _mean(s.metadata.get("prefix_turns", 0) for s in multi)
        if any(p.get("mode") == "b2f" for p in plans):
            out.update(prefix_source_metrics(multi))
    kl_lists = train_stats.get("per_sample_opd_kl")
    if kl_lists:
        turns, trajectory = per_turn_kl(samples, kl_lists)
        out["opd/trajectory_kl_mean"] = _mean(trajectory)
        out["opd/trajectory_kl_std"] = _std(trajectory)
        if turns:
            out["opd/per_turn_kl"] = turns
    # The slope reads the whole-distribution KL where the trainer has it (--opd-loss full, top-k): less noisy.
    slope_kls = train_stats.get("per_sample_opd_exact_kl") or kl_lists
    if slope_kls:
        out["opd/turn_kl_slopes"] = turn_kl_slopes(samples, slope_kls)
        out["opd/turn_kl_slope_source"] = "exact" if train_stats.get("per_sample_opd_exact_kl") else "sampled"
    exact_lists = train_stats.get("per_sample_opd_exact_kl")
    if exact_lists:
        # The whole-distribution KL summed over each trajectory's trained positions, like the sampled one.
        _, trajectory = per_turn_kl(samples, exact_lists)
        out["opd/trajectory_exact_kl_mean"] = _mean(trajectory)
    return out
