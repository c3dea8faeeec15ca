"""Controllers for the reward-side KL coefficient (``--kl-coef``), after Ziegler et al. 2019 (arXiv:1909.08593).

With ``--kl-ctrl adaptive`` the coefficient ``beta`` that shapes per-token rewards (``r_t - beta * kl_t``) is
moved toward ``--kl-target`` after every training step::

    error = clip(observed_kl / target_kl - 1, -0.2, 0.2)
    beta  = beta * (1 + error * n_steps / horizon)

where ``n_steps`` is the number of samples in the step and ``observed_kl`` is the mean over samples of each
sample's masked mean KL (per token). ``FixedKLController`` keeps ``beta`` constant.
"""

import json
import logging
import math
import os

import torch.distributed as dist

logger = logging.getLogger(__name__)


def _check_positive(name, value):
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")


class FixedKLController:
    """A constant coefficient: ``update`` never changes it."""

    kind = "fixed"

    def __init__(self, kl_coef):
        if not math.isfinite(kl_coef) or kl_coef < 0:
            raise ValueError(f"kl_coef must be finite and >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl, n_steps):
        return {"kl_ctrl/coef": self.value, "kl_ctrl/observed_kl": float(current_kl)}

    def state_dict(self):
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state):
        if state.get("kind") != self.kind:
            raise ValueError(f"the saved KL controller is {state.get('kind')!r}, this run uses {self.kind!r}")
        self.value = float(state["value"])


class AdaptiveKLController:
    """Moves the coefficient toward ``target_kl`` in proportion to the clipped relative error.

    ``clip`` bounds the relative error; ``coef_min`` / ``coef_max``, when given, bound the coefficient.
    """

    kind = "adaptive"

    def __init__(self, init_kl_coef, target_kl, horizon, clip=0.2, coef_min=None, coef_max=None):
        _check_positive("init_kl_coef", init_kl_coef)
        _check_positive("target_kl", target_kl)
        _check_positive("horizon", horizon)
        for name, bound in (("coef_min", coef_min), ("coef_max", coef_max)):
            if bound is not None:
                _check_positive(name, bound)
        if not 0 < clip <= 1:
            raise ValueError(f"clip must lie in (0, 1], got {clip}")
        if coef_min is not None and coef_max is not None and coef_min >= coef_max:
            raise ValueError(f"coef_min ({coef_min}) must be < coef_max ({coef_max})")
        self.target = float(target_kl)
        self.horizon = float(horizon)
        self.clip = float(clip)
        self.coef_min = coef_min
        self.coef_max = coef_max
        self.value = self._bounded(float(init_kl_coef))
        self.n_updates = 0

    def _bounded(self, value):
        if self.coef_min is not None:
            value = max(value, self.coef_min)
        if self.coef_max is not None:
            value = min(value, self.coef_max)
        return value

    def update(self, current_kl, n_steps):
        """Apply one step's observation; returns the ``kl_ctrl/*`` metrics. A non-finite KL is refused."""
        if not math.isfinite(current_kl):
            raise ValueError(f"observed KL is not finite ({current_kl}); the KL coefficient is left unchanged")
        if not math.isfinite(n_steps) or n_steps <= 0:
            raise ValueError(f"n_steps must be finite and > 0, got {n_steps}")
        raw_error = current_kl / self.target - 1.0
        error = min(max(raw_error, -self.clip), self.clip)
        factor = 1.0 + error * n_steps / self.horizon
        if factor <= 0 and self.coef_min is None:
            raise ValueError(
                f"a step of {n_steps} samples with horizon {self.horizon} would make the KL coefficient "
                "non-positive; use a larger horizon"
            )
        self.value = self._bounded(self.value * factor)
        self.n_updates += 1
        return {
            "kl_ctrl/coef": self.value,
            "kl_ctrl/observed_kl": float(current_kl),
            "kl_ctrl/target_kl": self.target,
            "kl_ctrl/error": error,
            "kl_ctrl/clipped": float(error != raw_error),
        }

    def state_dict(self):
        return {
            "kind": self.kind,
            "value": self.value,
            "n_updates": self.n_updates,
            "target": self.target,
            "horizon": self.horizon,
        }

    def load_state_dict(self, state):
        if state.get("kind") != self.kind:
            raise ValueError(f"the saved KL controller is {state.get('kind')!r}, this run uses {self.kind!r}")
        value = float(state["value"])
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"the saved KL coefficient is not finite and > 0 ({value})")
        self.value = self._bounded(value)
        self.n_updates = int(state.get("n_updates", 0))


def build_kl_controller(args, **options):
    """The controller ``--kl-ctrl`` asks for; ``options`` go to ``AdaptiveKLController``."""
    if getattr(args, "kl_ctrl", "fixed") == "adaptive":
        return AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon, **options)
    return FixedKLController(args.kl_coef)


def _state_path(root, rollout_id):
    return os.path.join(root, "kl_ctrl", f"kl_ctrl_state_dict_{rollout_id}.json")


def save_kl_controller(controller, save_dir, rollout_id):
    """Write the controller's state beside the checkpoint of ``rollout_id`` (atomically: tmp file, then rename)."""
    path = _state_path(save_dir, rollout_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(controller.state_dict(), f)
    os.replace(path + ".tmp", path)


def restore_kl_controller(controller, args, loaded_rollout_id, group=None):
    """Restore the state saved with the checkpoint this run loaded (``loaded_rollout_id``, so ``--ckpt-step``
    counts); nothing without ``--load`` or with ``--finetune``. Rank 0 reads the file and broadcasts it over
    ``group``, so every rank restores the same value. Returns the restored state, or None (one log line)."""
    if args.load is None or args.finetune:
        return None
    path = _state_path(args.load, loaded_rollout_id)
    state = [None]
    if (group is None or dist.get_rank() == 0) and os.path.exists(path):
        with open(path) as f:
            state[0] = json.load(f)
    if group is not None:
        dist.broadcast_object_list(state, src=0, group=group)
    if state[0] is None:
        logger.info(f"no KL controller state at {path}; the KL coefficient starts from --kl-coef")
    else:
        controller.load_state_dict(state[0])
    return state[0]


def step_kl_controller(controller, observed_kl, n_samples, check_group=None):
    """One step's update from the reduced ``(observed_kl, n_samples)``; no samples, no update. Returns the
    ``kl_ctrl/*`` metrics with ``kl_ctrl/coef`` the value used this step. With ``check_group`` (``--ci-test``)
    asserts the new value is the same on every rank and moved with the sign of the error."""
    coef_used = controller.value
    if n_samples == 0:
        return {"kl_ctrl/coef": coef_used}
    metrics = {**controller.update(observed_kl, n_samples), "kl_ctrl/coef": coef_used}
    if check_group is not None:
        values = [None] * dist.get_world_size(check_group)
        dist.all_gather_object(values, controller.value, group=check_group)
        assert len(set(values)) == 1, f"the KL coefficient differs across ranks: {values}"
        assert (controller.value - coef_used) * metrics.get("kl_ctrl/error", 0.0) >= 0, metrics
    return metrics
