"""train_cpu.py's kl-adaptive case: the KL PR's ``--kl-ctrl adaptive`` in slime's own train.py (PPO, 2 ranks).

SLIME_DIR must hold the KL PR (``port.py --pr adaptive-kl DIR`` on a copy of slime): the case runs what it is given,
so a mutated PR is what gets checked. Two invocations of train.py on the saved rollout data: 3 steps saving a
checkpoint each step, then a resume from the last one for a 4th step. The actor is observed through
cpu_shims/slime_cpu_shims/kl_probe.py (per rank: the controller's value before/after each step, what a resume
restored, and every sample's per-token KL and PPO returns). Checked here, independently of the PR's code:
1. each step moves the coefficient with the sign of (observed KL / target - 1), and the value is equal on both ranks;
2. the rewards were shaped with the controller's value, not --kl-coef: with gamma = lambd = 1 a return falls by
   coef * kl_t from token t to t + 1, so a least-squares fit over all tokens gives the coefficient used;
3. the state file saved with the last checkpoint holds the value after that step;
4. the resume restores it exactly, and its step's rewards are shaped with it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

KL_COEF = 0.05
KL_TARGET = 0.01
KL_HORIZON = 8  # a step of 4 samples moves the coefficient by up to 0.2 * 4 / 8 = 10%
FIT_RTOL = 1e-3


class KLCheckFailed(AssertionError):
    pass


def fitted_coef(samples: list[dict]) -> float | None:
    """The coefficient c that best explains returns[t] - returns[t + 1] = -c * kl[t] over the masked tokens before
    each sample's last one (the task reward sits on the last token), or None when the KL is all zero."""
    num = den = 0.0
    for s in samples:
        kl, ret, mask = s["kl"], s["returns"], s["mask"]
        for t in range(len(ret) - 1):
            if mask[t] and mask[t + 1]:
                num += -(ret[t] - ret[t + 1]) * kl[t]
                den += kl[t] * kl[t]
    return num / den if den > 1e-12 else None


def read_trace(trace: Path) -> dict[int, list[dict]]:
    """{rank: its records in order}; records of the critic (all-zero KL) are left out."""
    out: dict[int, list[dict]] = {}
    for f in sorted(trace.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["event"] == "advantages" and fitted_coef(rec["samples"]) is None:
                continue
            out.setdefault(rec["rank"], []).append(rec)
    return out


def _close(a: float, b: float, rtol: float = FIT_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def check_run(records: dict[int, list[dict]], first_value: float, kl_coef: float, what: str) -> list[dict]:
    """Checks 1 and 2 on one train.py invocation; returns rank 0's steps."""
    if sorted(records) != [0, 1]:
        raise KLCheckFailed(f"{what}: trace from ranks {sorted(records)}, expected [0, 1]")
    steps = {r: [x for x in recs if x["event"] == "step"] for r, recs in records.items()}
    advs = {r: [x for x in recs if x["event"] == "advantages"] for r, recs in records.items()}
    if len(steps[0]) != len(steps[1]) or not steps[0]:
        raise KLCheckFailed(f"{what}: controller steps per rank {[len(steps[r]) for r in (0, 1)]}")
    for k, (s0, s1) in enumerate(zip(steps[0], steps[1])):
        if (s0["before"], s0["after"]) != (s1["before"], s1["after"]):
            raise KLCheckFailed(f"{what} step {k}: the coefficient differs across ranks: rank 0 {s0}, rank 1 {s1}")
        error = s0["observed_kl"] / s0["target"] - 1.0
        if not (s0["after"] - s0["before"]) * error > 0:
            raise KLCheckFailed(f"{what} step {k}: coefficient {s0['before']} -> {s0['after']} did not move with the "
                                f"sign of the error {error:+.3f} (observed KL {s0['observed_kl']})")
        expected_before = first_value if k == 0 else steps[0][k - 1]["after"]
        if s0["before"] != expected_before:
            raise KLCheckFailed(f"{what} step {k}: started from {s0['before']}, expected {expected_before}")
    for r in (0, 1):
        if len(advs[r]) != len(steps[r]):
            raise KLCheckFailed(f"{what}: rank {r} computed advantages {len(advs[r])} times for {len(steps[r])} steps")
        for k, (adv, st) in enumerate(zip(advs[r], steps[r])):
            c = fitted_coef(adv["samples"])
            if not _close(c, st["before"]):
                raise KLCheckFailed(
                    f"{what} step {k} rank {r}: the rewards' KL term was shaped with coefficient {c:.6g}, the "
                    f"controller's value was {st['before']:.6g} (--kl-coef {kl_coef})")
            if k > 0 and _close(c, kl_coef, 10 * FIT_RTOL):
                raise KLCheckFailed(f"{what} step {k} rank {r}: the fit {c:.6g} cannot tell the controller's value "
                                    f"from --kl-coef {kl_coef}: the case would not catch --kl-coef used instead")
    return steps[0]


def check_saved_state(save: Path, rollout_id: int, value: float) -> None:
    path = save / "kl_ctrl" / f"kl_ctrl_state_dict_{rollout_id}.json"
    if not path.is_file():
        found = sorted(str(p.relative_to(save)) for p in save.rglob("*kl*"))
        raise KLCheckFailed(f"no KL controller state saved with checkpoint {rollout_id} ({path}); found {found}")
    state = json.loads(path.read_text())
    if state.get("value") != value:
        raise KLCheckFailed(f"{path} holds {state}, the controller ended step {rollout_id} at {value}")


def check_resume(records: dict[int, list[dict]], saved_value: float) -> float:
    for r in (0, 1):
        restores = [x for x in records.get(r, []) if x["event"] == "restore"]
        if not restores or restores[0]["value"] != saved_value:
            raise KLCheckFailed(f"resume rank {r}: restored {[x['value'] for x in restores]}, saved {saved_value}")
    return saved_value


def summary(steps: list[dict]) -> str:
    return " -> ".join(f"{s['before']:.5g}" for s in steps) + f" -> {steps[-1]['after']:.5g}"


def is_finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
