"""Per-step metrics: always a jsonl file; TensorBoard and wandb when asked.

One record per step: ``{"step": n, "time": unix_seconds, **metrics}``. Values that are not plain
numbers (lists, e.g. per-turn KL by turn index) are written to jsonl as they are and skipped by the
scalar back-ends.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


def metrics_dir(args) -> Path:
    return Path(args.metrics_dir or args.save or "outputs")


def read_metrics(path) -> list[dict]:
    """All records of a metrics.jsonl file (for plots, tests and resume checks)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _jsonable(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


class MetricsLogger:
    def __init__(self, args, filename: str = "metrics.jsonl", resume_step: int | None = None):
        out = metrics_dir(args)
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / filename
        if resume_step is not None and self.path.exists():
            # A run that died after its last checkpoint logged steps that will now run again: keep only
            # the records before the resume point so every step appears once.
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) < resume_step]
            with open(self.path, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in kept)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        self._wandb = None
        if getattr(args, "use_tensorboard", False):
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out / "tensorboard"))
        if getattr(args, "use_wandb", False):
            import wandb

            self._wandb = wandb.init(project=args.wandb_project or "slime-tcod", group=args.wandb_group,
                                     config={k: v for k, v in vars(args).items() if _is_scalar(v)},
                                     resume="allow", dir=str(out))

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": int(step), "time": time.time(), **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        scalars = {k: float(v) for k, v in metrics.items() if _is_scalar(v) and not isinstance(v, str)}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _is_scalar(value) -> bool:
    return isinstance(value, (int, float, str, bool)) and not (isinstance(value, float) and not math.isfinite(value))
