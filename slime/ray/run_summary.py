"""What ``train.py`` says when a run ends, and how Ctrl-C stops it.

Every run past its input checks ends with one line on stderr, finished, failed or interrupted::

    train.py: done: 60 of 60 steps (last: step 59), last checkpoint /x/iter_0000059, metrics /x/metrics.jsonl

(``interrupted``, ``failed`` or ``stopped`` (SIGTERM) instead of ``done``; ``none`` where there is no
checkpoint or metrics file). Steps are counted, then the last one is named by its number, from 0 as the
metrics rows' ``step`` and the checkpoints' ``iter_`` folders are.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path


# The progress bar's fields: (metric, label). Distillation shows what it trains on, the TCOD depth and the
# teacher-student KL; the environment's success is named as such, never "reward" (OPD trains on no reward).
OPD_BAR = (("tcod/depth", "depth"), ("opd/reverse_kl", "opd_kl"), ("multi_turn/success_rate", "env_success"),
           ("loss", "loss"), ("time/step", "step_s"))
RL_BAR = (("rollout/reward", "reward"), ("loss", "loss"), ("time/step", "step_s"))
SFT_BAR = (("loss", "loss"), ("time/step", "step_s"))  # expert replays: their return says nothing of the policy


def bar_fields(args, metrics: dict) -> dict:
    """The progress bar's postfix for a step's ``metrics``."""
    fields = SFT_BAR if args.loss_type == "sft_loss" else OPD_BAR if args.use_opd else RL_BAR
    return {label: (f"{metrics[key]:.3g}" if isinstance(metrics[key], float) else metrics[key])
            for key, label in fields if key in metrics}


class RunProgress:
    """Where a run is: the step in progress, the last step logged, the last checkpoint, the metrics file."""

    def __init__(self, total: int, checkpoint=None):
        self.total = total
        self.current: int | None = None  # the step being run, or the last one begun (None: starting)
        self.last_step: int | None = None  # the last step whose metrics row was written
        self.checkpoint = checkpoint  # the last checkpoint written by this run, else the one it resumed from
        self.metrics = None
        self.told_interrupt = False

    def started(self, step: int) -> None:
        self.current = step

    def logged(self, step: int) -> None:
        self.last_step = step

    def saved(self, path) -> None:
        self.checkpoint = path

    def tell_interrupt(self) -> None:
        """The one line Ctrl-C prints, before the stop begins."""
        where = "while starting" if self.current is None else f"at step {self.current}"
        print(f"train.py: interrupted {where}; stopping engines and trainers", file=sys.stderr, flush=True)
        self.told_interrupt = True

    def summary(self, status: str) -> str:
        # Counted ("3 of 3 steps"), then the last step's number, which counts from 0 as the rows and iter_ do.
        done = 0 if self.last_step is None else self.last_step + 1
        last = "" if self.last_step is None else f" (last: step {self.last_step})"
        metrics = self.metrics if self.metrics is not None and Path(self.metrics).is_file() else "none"
        return f"{status}: {done} of {self.total} steps{last}, last checkpoint {self.checkpoint or 'none'}, " \
               f"metrics {metrics}"


class StopOnSigint:
    """The SIGINT handler of a run: the first Ctrl-C raises ``KeyboardInterrupt``, later ones are ignored, so
    the stop it starts (engines, trainers, Ray; each step bounded) runs to its end instead of being cut half-way.

    Inside ``deferred()`` the first Ctrl-C is raised only when the block ends: Ray interrupted inside
    ``ray.init`` is left half-started (and the process crashes at exit), so it is stopped once it is up."""

    def __init__(self, installed: bool):
        self.installed, self.hold, self.pending = installed, 0, False

    def __call__(self, signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.hold:
            self.pending = True
            return
        raise KeyboardInterrupt

    def ignore(self) -> None:
        """From now on Ctrl-C is ignored (where this handler is installed)."""
        if self.installed:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    @contextlib.contextmanager
    def deferred(self):
        self.hold += 1
        try:
            yield
        finally:
            self.hold -= 1
        if self.pending and not self.hold:
            self.pending = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def first_sigint_stops():
    """Install :class:`StopOnSigint` for the block (yielded) and restore Python's handler after it.

    Only where Ctrl-C has Python's default behaviour (not ignored, as in a background job) and in the main
    thread; elsewhere the yielded handler is not installed and ``deferred()`` does nothing."""
    installed = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    handler = StopOnSigint(installed)
    if not installed:
        yield handler
        return
    signal.signal(signal.SIGINT, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
