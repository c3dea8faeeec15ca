"""A recorder in the Ray workers for the kl-adaptive case (armed only when TRAIN_CPU_KL_TRACE names a folder).

It changes no behaviour: it wraps, after their modules are imported,
- ``slime.backends.megatron_utils.loss.compute_advantages_and_returns``: after slime computes them, records per
  sample the per-token KL, the returns and the loss mask; train_cpu.py fits from them the coefficient that shaped
  the rewards (with ``--gamma 1 --lambd 1`` a PPO return falls by ``coef * kl_t`` from token t to t+1);
- ``slime.utils.kl_controller.step_kl_controller`` / ``restore_kl_controller`` (the KL PR's): the controller's value
  before and after each step, the observed KL and the target, and what a resume restored.
One JSON line per call to ``TRACE/rank{RANK}-{pid}.jsonl``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

_STEP = {"n": 0}


def _write(record: dict) -> None:
    trace = Path(os.environ["TRAIN_CPU_KL_TRACE"])
    trace.mkdir(parents=True, exist_ok=True)
    record = {"rank": int(os.environ.get("RANK", "-1")), **record}
    # One file per process: the critic's ranks carry the same RANK numbers as the actor's.
    with open(trace / f"rank{record['rank']}-{os.getpid()}.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")


def _floats(x) -> list[float]:
    return [float(v) for v in x.detach().flatten().tolist()]


def wrap_loss(module) -> None:
    original = module.compute_advantages_and_returns

    def compute_advantages_and_returns(args, rollout_data, *a, **kw):
        out = original(args, rollout_data, *a, **kw)
        if rollout_data.get("kl") is not None and rollout_data.get("returns") is not None:
            _write({"event": "advantages", "call": _STEP["n"], "args_kl_coef": float(args.kl_coef),
                    "samples": [{"kl": _floats(k), "returns": _floats(r), "mask": _floats(m)}
                                for k, r, m in zip(rollout_data["kl"], rollout_data["returns"],
                                                   rollout_data["loss_masks"])]})
            _STEP["n"] += 1
        return out

    compute_advantages_and_returns.__wrapped__ = original
    module.compute_advantages_and_returns = compute_advantages_and_returns


def wrap_controller(module) -> None:
    step, restore = module.step_kl_controller, module.restore_kl_controller

    def step_kl_controller(controller, observed_kl, n_samples, *a, **kw):
        before = float(controller.value)
        out = step(controller, observed_kl, n_samples, *a, **kw)
        _write({"event": "step", "before": before, "after": float(controller.value), "observed_kl": float(observed_kl),
                "n_samples": int(n_samples), "target": float(controller.target)})
        return out

    def restore_kl_controller(controller, *a, **kw):
        out = restore(controller, *a, **kw)
        _write({"event": "restore", "value": float(controller.value)})
        return out

    module.step_kl_controller, module.restore_kl_controller = step_kl_controller, restore_kl_controller


def arm(when_imported) -> None:
    if os.environ.get("TRAIN_CPU_KL_TRACE"):
        when_imported("slime.backends.megatron_utils.loss", wrap_loss)
        when_imported("slime.utils.kl_controller", wrap_controller)
