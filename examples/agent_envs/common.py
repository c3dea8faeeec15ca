"""Helpers of this repository's environment adapters that need downloaded data or a game engine.

The adapters follow upstream slime's contract (``examples/agent_envs/puzzle.py`` describes it):
``build_env(sample, args)``, ``reset() -> (observation, info)``, ``step(response_text) -> (observation,
done, info)`` with ``info["reward"]`` and ``info["success"]``, ``format_observation``, ``close`` and
``expert_actions``. The game receives only the action part of a reply (``reply_action``).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.agent_envs.puzzle import THINK_CLOSE, THINK_OPEN


def require_data_dir(env_name: str, metadata: dict, env_var: str, how_to_get: str) -> Path:
    """The folder of downloaded data (``metadata["data_dir"]``, else ``$ENV_VAR``), or a clear error.

    Raised when the environment is built, so a run without the data stops at start-up and says what to
    download and where to point, instead of failing every episode later.
    """
    folder = metadata.get("data_dir") or os.environ.get(env_var)
    if not folder:
        raise FileNotFoundError(
            f"{env_name} needs data that is not part of this project and is never downloaded by it. "
            f"{how_to_get} Then point at it: export {env_var}=/path/to/it (or set 'data_dir' in the "
            f"task metadata)."
        )
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"{env_name} data folder {str(path)!r} (from {'metadata data_dir' if metadata.get('data_dir') else env_var}) "
            f"does not exist. {how_to_get}"
        )
    return path


def close_quietly(resource, close: Callable[[Any], None] | None = None) -> None:
    """Close a resource that may already be broken (a crashed JVM, a dead game): nothing to free then."""
    if resource is None:
        return
    try:
        (close or (lambda r: r.close()))(resource)
    except Exception:
        pass


class ResourcePool:
    """Idle heavy resources (a JVM, a product catalogue) kept per process for the next episode.

    Episodes run concurrently, so each takes its own resource; a finished episode gives it back, a
    failed one discards it (its state is unknown). At most ``max_idle`` are kept; all close at exit.
    """

    def __init__(self, create: Callable[[], Any], close: Callable[[Any], None], max_idle: int = 8):
        self._create, self._close, self.max_idle = create, close, max_idle
        self._idle: list = []
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def acquire(self):
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._create()

    def release(self, resource) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(resource)
                return
        self.discard(resource)

    def discard(self, resource) -> None:
        close_quietly(resource, self._close)

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for resource in idle:
            self.discard(resource)


def no_action_observation(how_to_act: str) -> str:
    """The answer to a reply that stopped inside ``<think>``: nothing reaches the game, the step is invalid."""
    return (
        f"No action: the reply ended inside {THINK_OPEN}. Think briefly, close with {THINK_CLOSE}, "
        f"then give one action: {how_to_act}"
    )


def user_message(observation: str) -> dict:
    """``format_observation`` of the text environments here: the observation as one user turn."""
    return {"role": "user", "content": observation}
