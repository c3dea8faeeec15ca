"""Reward-side KL coefficient controllers (Ziegler et al. 2019, arXiv:1909.08593).

The coefficient shapes per-token rewards, ``r'_t = r_t - beta * KL_t``, for the estimators that use
reward-side KL (ppo, reinforce_plus_plus[_baseline]). The adaptive rule after each batch is::

    e    = clip(KL_observed / KL_target - 1, -clip, clip)
    beta = beta * (1 + e * n_steps / horizon)            then bounded to [coef_min, coef_max]

``n_steps`` is the number of samples in the batch. ``KL_observed`` must be in the unit the target was
chosen in (per-token mean or per-sequence sum); the caller measures it.
"""

from __future__ import annotations

import math


class FixedKLController:
    """A constant coefficient (the default): ``update`` records nothing and changes nothing."""

    kind = "fixed"

    def __init__(self, kl_coef: float):
        if not math.isfinite(kl_coef) or kl_coef < 0:
            raise ValueError(f"kl_coef must be finite and >= 0, got {kl_coef}")
        self.value = float(kl_coef)
        self.last_stats: dict[str, float] = {}

    def update(self, current_kl: float, n_steps: int) -> dict[str, float]:
        self.last_stats = {"kl_ctrl/observed_kl": float(current_kl), "kl_ctrl/coef": self.value}
        return self.last_stats

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"checkpoint holds a {state.get('kind')!r} KL controller, this run uses {self.kind!r}")
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller that moves the coefficient toward a target KL."""

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float, clip: float = 0.2,
                 coef_min: float = 1e-6, coef_max: float = 1e3):
        for name, value in (("init_kl_coef", init_kl_coef), ("target_kl", target_kl), ("horizon", horizon),
                            ("coef_min", coef_min), ("coef_max", coef_max)):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if not 0 < clip <= 1:
            raise ValueError(f"clip must lie in (0, 1], got {clip}")
        if coef_min >= coef_max:
            raise ValueError(f"coef_min ({coef_min}) must be < coef_max ({coef_max})")
        self.target = float(target_kl)
        self.horizon = float(horizon)
        self.clip = float(clip)
        self.coef_min = float(coef_min)
        self.coef_max = float(coef_max)
        self.value = min(max(float(init_kl_coef), self.coef_min), self.coef_max)
        self.n_updates = 0
        self.last_stats: dict[str, float] = {}

    def update(self, current_kl: float, n_steps: int) -> dict[str, float]:
        if not math.isfinite(current_kl):
            raise ValueError(f"observed KL is not finite ({current_kl}); refusing to update the KL coefficient")
        if not math.isfinite(n_steps) or n_steps <= 0:
            # An infinite step count times a zero error is NaN, which the bounds below would let through.
            raise ValueError(f"n_steps must be finite and > 0, got {n_steps}")
        raw_error = current_kl / self.target - 1.0
        error = min(max(raw_error, -self.clip), self.clip)
        self.value = self.value * (1.0 + error * n_steps / self.horizon)
        # The factor is >= 1 - clip * n_steps / horizon and can reach 0 or below for huge batches;
        # the lower bound keeps the coefficient positive so it can always recover.
        self.value = min(max(self.value, self.coef_min), self.coef_max)
        self.n_updates += 1
        self.last_stats = {
            "kl_ctrl/observed_kl": float(current_kl),
            "kl_ctrl/target_kl": self.target,
            "kl_ctrl/coef": self.value,
            "kl_ctrl/error": error,
            "kl_ctrl/clipped": float(error != raw_error),
        }
        return self.last_stats

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "n_updates": self.n_updates, "target": self.target,
                "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"checkpoint holds a {state.get('kind')!r} KL controller, this run uses {self.kind!r}")
        value = float(state["value"])
        if not math.isfinite(value):
            # min/max pass NaN through unchanged, so the bounds alone would not catch a corrupt state.
            raise ValueError(f"checkpoint KL coefficient is not finite ({value})")
        self.value = min(max(value, self.coef_min), self.coef_max)
        self.n_updates = int(state.get("n_updates", 0))


def build_kl_controller(args):
    """The controller that ``args`` asks for (``--kl-ctrl``, validated by arguments.validate_args)."""
    if getattr(args, "kl_ctrl", "fixed") == "adaptive":
        return AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon, args.kl_ctrl_clip,
                                    args.kl_coef_min, args.kl_coef_max)
    return FixedKLController(args.kl_coef)
