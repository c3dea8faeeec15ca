"""A line every few seconds while a long wait runs, so no wait a user sits through is silent.

    with heartbeat("train.py: still starting the trainer and the rollout engine(s)"):
        ...  # minutes of model loading in other processes

prints ``MESSAGE (N s)`` on stderr every ``every`` seconds until the block ends (nothing for a short block).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time


EVERY = 10.0  # seconds between lines, unless a caller says otherwise


@contextlib.contextmanager
def heartbeat(message, every: float | None = None, stream=None):
    """``message``: the line, or a function returning it (for a count that moves)."""
    stream = stream or sys.stderr
    every = EVERY if every is None else every
    done = threading.Event()
    start = time.monotonic()

    def beat():
        while not done.wait(every):
            text = message() if callable(message) else message
            print(f"{text} ({time.monotonic() - start:.0f} s)", file=stream, flush=True)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
