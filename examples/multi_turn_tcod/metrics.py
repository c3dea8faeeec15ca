"""Curriculum and KL metrics of multi-turn TCOD rollouts, through slime's rollout-log hook.

``--custom-rollout-log-function-path examples.multi_turn_tcod.metrics.log_rollout_data`` adds the ``tcod/*``
keys of the example's README ("Metrics") to the step's rollout metrics and returns False, so
the default logging still runs and emits them. The KL keys (``log p_student - log p_teacher``; the official
TCOD code's ``kl/mean`` and ``kl/trajectory_*``) need a server teacher's scores.

With ``--ci-test`` it asserts that every sample was planned at the step's depth and played no more turns
than its plan allows (F2B: the depth; B2F: replayed and student turns within ``max_turns``) and, with a server
teacher, that the teacher scored every trained trajectory.
"""

from slime.rollout.tcod import episode_plan


def _teacher_log_probs(sample) -> list[float] | None:
    """The teacher's response-span log-probs: post-processed, or still in the reply logged before that."""
    if sample.teacher_log_probs is not None:
        return [float(x) for x in sample.teacher_log_probs]
    reply = sample.reward
    if not isinstance(reply, dict) or "input_token_logprobs" not in (reply.get("meta_info") or {}):
        return None
    entries = reply["meta_info"]["input_token_logprobs"][1:]
    if sample.response_length > len(entries):
        return None
    return [float(e[0]) for e in entries[len(entries) - sample.response_length :]]


def _kl_metrics(samples) -> dict:
    token_kls, trajectory_kls, turn_kls = [], [], {}
    for sample in samples:
        teacher = _teacher_log_probs(sample)
        if teacher is None or sample.rollout_log_probs is None:
            continue
        kl = [s - t for s, t in zip(sample.rollout_log_probs, teacher, strict=True)]
        trained = [d for d, m in zip(kl, sample.loss_mask, strict=True) if m]
        token_kls += trained
        trajectory_kls.append(sum(trained))
        for turn, (start, end) in enumerate(sample.metadata.get("turn_spans", []), start=1):
            if end > start:
                turn_kls.setdefault(turn, []).append(sum(kl[start:end]) / (end - start))
    if not token_kls:
        return {}
    out = {
        "tcod/kl_mean": sum(token_kls) / len(token_kls),
        "tcod/kl_trajectory_mean": sum(trajectory_kls) / len(trajectory_kls),
        "tcod/kl_trajectory_max": max(trajectory_kls),
    }
    out |= {f"tcod/kl_turn_{t}": sum(v) / len(v) for t, v in sorted(turn_kls.items())}
    return out


def rollout_metrics(args, samples) -> dict:
    """The metrics above for one rollout's (flat) samples."""
    multi_turn = [s for s in samples if "turn_spans" in (s.metadata or {})]
    if not multi_turn:
        return {}
    trained = [s for s in multi_turn if not s.remove_sample]
    n = len(multi_turn)
    out = {
        "tcod/prefix_turns": sum(s.metadata.get("prefix_turns", 0) for s in multi_turn) / n,
        "tcod/turns": sum(s.metadata["num_turns"] for s in multi_turn) / n,
        "tcod/success_rate": sum(bool(s.metadata.get("success")) for s in multi_turn) / n,
        "tcod/return": sum(s.metadata.get("task_reward", 0.0) for s in multi_turn) / n,
        "tcod/turns_cut": sum(s.metadata["turns_without_stop"] for s in multi_turn)
        / max(1, sum(s.metadata["num_turns"] for s in multi_turn)),
        "tcod/removed": n - len(trained),
    }
    depths = [s.metadata["episode_plan"]["depth"] for s in multi_turn if "depth" in s.metadata.get("episode_plan", {})]
    if depths:
        out["tcod/depth"] = max(depths)
    if getattr(args, "use_opd", False) and getattr(args, "opd_type", None) == "sglang":
        scored = [s for s in trained if _teacher_log_probs(s) is not None]
        out["tcod/teacher_scored"] = len(scored) / max(1, len(trained))
    return out | _kl_metrics(trained)


def _check_ci(args, rollout_id: int, samples, metrics: dict) -> None:
    if getattr(args, "use_tcod", False):
        depth = episode_plan(args, rollout_id, args.max_turns)["depth"]  # the plan the agent loop asked for
        for s in samples:
            plan, turns = s.metadata.get("episode_plan", {}), s.metadata["prefix_turns"] + s.metadata["num_turns"]
            assert plan.get("depth") == depth, f"rollout {rollout_id}: plan {plan}, expected depth {depth}"
            assert turns <= plan["max_turns"], f"rollout {rollout_id}: {turns} turns, plan {plan}"
    if "tcod/teacher_scored" in metrics:
        assert metrics["tcod/teacher_scored"] == 1.0, f"rollout {rollout_id}: unscored trajectories"


def _flatten(samples) -> list:
    return [x for s in samples for x in (_flatten(s) if isinstance(s, list) else [s])]


def log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool:
    """slime's ``--custom-rollout-log-function-path`` hook; returns False to keep the default logging."""
    samples = _flatten(samples)
    metrics = rollout_metrics(args, samples)
    if getattr(args, "ci_test", False):
        _check_ci(args, rollout_id, samples, metrics)
    if rollout_extra_metrics is not None:
        rollout_extra_metrics.update(metrics)
    return False
