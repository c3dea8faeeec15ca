"""Adaptive coefficient for the reward-side KL penalty (``--kl-ctrl adaptive``), after Ziegler et al. 2019
(arXiv:1909.08593).

The coefficient ``beta`` that shapes per-token rewards (``r_t - beta * kl_t``) starts at ``--kl-coef`` and is
moved toward ``--kl-target`` after every training step::

    error = clip(observed_kl / target_kl - 1, -0.2, 0.2)
    beta  = beta * (1 + error * n_steps / horizon)

where ``n_steps`` is the number of samples in the step and ``observed_kl`` is the mean over samples of each
sample's masked mean KL per token (verl's unit; Ziegler et al. and TRL sum the KL over a sample's tokens instead).
"""

import json
import logging
import math
import os

import torch.distributed as dist

logger = logging.getLogger(__name__)

ERROR_CLIP = 0.2


def _check_positive(name, value):
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")


class AdaptiveKLController:
    """Moves the coefficient toward ``target_kl`` in proportion to the clipped relative error."""

    def __init__(self, init_kl_coef, target_kl, horizon):
        _check_positive("init_kl_coef", init_kl_coef)
        _check_positive("target_kl", target_kl)
        _check_positive("horizon", horizon)
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl, n_steps):
        """One step's update; returns the ``kl_ctrl/*`` metrics (``kl_ctrl/coef``: the value this step used,
        ``kl_ctrl/next_coef``: the updated one). A non-finite KL is refused; validation keeps n_steps <= horizon."""
        if not math.isfinite(current_kl):
            raise ValueError(f"observed KL is not finite ({current_kl}); the KL coefficient is left unchanged")
        _check_positive("n_steps", n_steps)
        raw_error = current_kl / self.target - 1.0
        error = min(max(raw_error, -ERROR_CLIP), ERROR_CLIP)
        used = self.value
        self.value *= 1.0 + error * n_steps / self.horizon
        return {
            "kl_ctrl/coef": used,
            "kl_ctrl/next_coef": self.value,
            "kl_ctrl/observed_kl": float(current_kl),
            "kl_ctrl/target_kl": self.target,
            "kl_ctrl/error": error,
            "kl_ctrl/clipped": float(error != raw_error),
        }

    def state_dict(self):
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state):
        """Restore the coefficient; the target and horizon stay this run's (``changed_settings``)."""
        value = float(state["value"])
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"the saved KL coefficient is not finite and > 0 ({value})")
        self.value = value

    def changed_settings(self, state):
        """``{flag: (saved, now)}`` for ``--kl-target`` / ``--kl-horizon`` where this run's differs from ``state``."""
        flags = (("--kl-target", "target"), ("--kl-horizon", "horizon"))
        return {flag: (state[key], getattr(self, key)) for flag, key in flags if state[key] != getattr(self, key)}


def build_kl_controller(args):
    """The controller of ``--kl-ctrl adaptive``, from ``--kl-coef``, ``--kl-target`` and ``--kl-horizon``."""
    return AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon)


def kl_controller_state_path(root, rollout_id):
    return os.path.join(root, "kl_ctrl", f"kl_ctrl_state_dict_{rollout_id}.json")


def save_kl_controller(controller, save_dir, rollout_id):
    """Write the controller's state beside the checkpoint of ``rollout_id`` (atomically: tmp file, then rename)."""
    path = kl_controller_state_path(save_dir, rollout_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(controller.state_dict(), f)
    os.replace(path + ".tmp", path)


def restore_kl_controller(controller, args, loaded_rollout_id, group=None):
    """Restore the state saved with the checkpoint this run loaded (``--ckpt-step`` counts); nothing without
    ``--load`` or with ``--finetune``. Rank 0 reads it and broadcasts it over ``group``; it warns in one line when
    there is none or when this run's target / horizon differ (they are used). Returns the state, or None."""
    if args.load is None or args.finetune:
        return None
    path = kl_controller_state_path(args.load, loaded_rollout_id)
    is_rank_0 = group is None or dist.get_rank() == 0
    state = [None]
    if is_rank_0 and os.path.exists(path):
        with open(path) as f:
            state[0] = json.load(f)
    if group is not None:
        dist.broadcast_object_list(state, src=0, group=group)
    state = state[0]
    if state is None:
        if is_rank_0:
            logger.warning(f"no KL controller state at {path}; the KL coefficient starts from --kl-coef")
        return None
    controller.load_state_dict(state)
    changed = controller.changed_settings(state)
    if changed and is_rank_0:
        settings = ", ".join(f"{flag} {saved} -> {now}" for flag, (saved, now) in changed.items())
        logger.warning(f"resuming the KL coefficient {controller.value} of {path} with new settings: {settings}")
    return state


def step_kl_controller(controller, observed_kl, n_samples, check_group=None):
    """One step's update from the reduced ``(observed_kl, n_samples)``; no samples, no update. Returns the
    ``kl_ctrl/*`` metrics (``kl_ctrl/coef``: the value this step used). With ``check_group`` (``--ci-test``)
    asserts the new value is the same on every rank."""
    if n_samples == 0:
        return {"kl_ctrl/coef": controller.value}
    metrics = controller.update(observed_kl, n_samples)
    if check_group is not None:
        values = [None] * dist.get_world_size(check_group)
        dist.all_gather_object(values, controller.value, group=check_group)
        assert len(set(values)) == 1, f"the KL coefficient differs across ranks: {values}"
    return metrics
