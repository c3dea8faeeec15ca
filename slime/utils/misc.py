"""Small helpers shared across the package: dotted-path plugins, a heartbeat line during long waits."""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import time


def load_function(path: str):
    """Import ``package.module.attr`` by dotted path (slime's plugin mechanism), with a clear error."""
    if not path or "." not in path:
        raise ValueError(f"expected a dotted path 'package.module.name', got {path!r}")
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import module {module_name!r} for plugin {path!r}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r} (plugin {path!r})") from None


# A line every few seconds while a long wait runs, so no wait a user sits through is silent:
#
#     with heartbeat("train.py: still starting the trainer and the rollout engine(s)"):
#         ...  # minutes of model loading in other processes
#
# prints ``MESSAGE (N s)`` on stderr every ``every`` seconds until the block ends (nothing for a short block).
HEARTBEAT_EVERY = 10.0  # seconds between lines, unless a caller says otherwise


@contextlib.contextmanager
def heartbeat(message, every: float | None = None, stream=None):
    """``message``: the line, or a function returning it (for a count that moves)."""
    stream = stream or sys.stderr
    every = HEARTBEAT_EVERY if every is None else every
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
