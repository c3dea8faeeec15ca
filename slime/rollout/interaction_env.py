"""The environment behind ``--rollout-interaction-env-path``, in one shape for the agent loop.

Two contracts are accepted, so environments written for upstream slime and for this example both work:

* **upstream slime's** (``examples/geo3k_vlm_multi_turn``): the path names a module (or a ``.py``
  file) exposing ``build_env(sample, args)``. Its env has ``reset()``, ``step(response_text) ->
  (observation, done, info)``, ``format_observation(observation) -> message`` and ``close()``. The
  step reward is read from ``info["reward"]`` (else ``info["score"]``, else 0); success from
  ``info["success"]``. When ``reset()`` gives no observation, the task text is ``sample.prompt``.
* **this example's factory**: the path names a callable ``make_env(args, sample)`` whose env has
  ``reset() -> str``, ``step(action) -> (observation, reward, done, info)``, ``close()``.

Either may offer ``expert_actions() -> list[str]`` (used by TCOD's B2F prefix). Whatever the env
returns is checked here; a malformed return raises :class:`EnvironmentContractError` naming the method
and what came back (a NaN or infinite reward included), and the agent loop turns it into a failed
episode instead of a crashed run. The agent loop also bounds every call in time (``--env-step-timeout``).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from pathlib import Path

from slime.utils.misc import load_function


class EnvironmentContractError(TypeError):
    """An environment returned something its contract does not allow."""


_BUILDERS: dict[str, object] = {}


def _module_from_file(path: Path):
    name = f"slime_interaction_env_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the environment module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(path: str):
    """(kind, callable): ("build_env", fn) for upstream's module contract, ("make_env", fn) otherwise."""
    if path.endswith(".py") and Path(path).is_file():
        module = _module_from_file(Path(path))
    else:
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as err:
            if err.name != path:  # the module exists but one of its own imports is missing
                raise
            module = None
    if module is not None:
        build = getattr(module, "build_env", None)
        if not callable(build):
            raise ValueError(f"--rollout-interaction-env-path {path!r} is a module without a callable "
                             "build_env(sample, args); name a module that has one, or a factory function "
                             "make_env(args, sample)")
        return "build_env", build
    factory = load_function(path)
    if not callable(factory):
        raise ValueError(f"--rollout-interaction-env-path {path!r} is not callable")
    return "make_env", factory


def build_interaction_env(args, sample) -> "InteractionEnv":
    """Build the environment of ``sample``'s task (blocking: call it off the event loop)."""
    path = getattr(args, "rollout_interaction_env_path", None)
    if not path:
        raise ValueError("the multi-turn rollout needs --rollout-interaction-env-path (a module exposing "
                         "build_env(sample, args), or a factory make_env(args, sample))")
    if path not in _BUILDERS:
        _BUILDERS[path] = _resolve(path)
    kind, fn = _BUILDERS[path]
    if kind == "build_env":
        return InteractionEnv(fn(sample, args), upstream_contract=True, sample=sample)
    return InteractionEnv(fn(args, sample), upstream_contract=False, sample=sample)


def _message_text(message) -> str:
    """The text of a chat message as ``format_observation`` returns it (string or list-of-parts content)."""
    content = message.get("content") if isinstance(message, dict) else message
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content):
            return "".join(parts)
        raise EnvironmentContractError("format_observation returned non-text content (images, ...): the "
                                       "multi-turn TCOD loop is text-only")
    raise EnvironmentContractError(f"format_observation returned {type(message).__name__}, not a message dict")


def _prompt_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return _message_text(prompt[-1])
    raise EnvironmentContractError("reset() gave no observation and sample.prompt is not text")


class InteractionEnv:
    """Either contract behind ``reset() -> str``, ``step(action) -> (obs, reward, done, info)``."""

    def __init__(self, env, *, upstream_contract: bool, sample):
        if env is None:
            raise EnvironmentContractError("the environment builder returned None")
        self.env = env
        self.upstream_contract = upstream_contract
        self.sample = sample

    @property
    def label(self) -> str:
        """Names the environment in error messages: ``environment <module>.<class>``."""
        cls = type(self.env)
        return f"environment {cls.__module__}.{cls.__qualname__}"

    def _text(self, observation, method: str) -> str:
        if isinstance(observation, str):
            return observation
        if self.upstream_contract and hasattr(self.env, "format_observation"):
            return _message_text(self.env.format_observation(observation))
        raise EnvironmentContractError(f"{method} returned an observation of type {type(observation).__name__}, "
                                       "not text")

    def reset(self) -> str:
        out = self.env.reset()
        if self.upstream_contract:
            observation = out[0] if isinstance(out, tuple) else out
            return _prompt_text(self.sample.prompt) if observation is None else self._text(observation, "reset()")
        return self._text(out, "reset()")

    def step(self, action: str):
        out = self.env.step(action)
        width = 3 if self.upstream_contract else 4
        if not isinstance(out, tuple) or len(out) != width:
            shape = "(observation, done, info)" if self.upstream_contract else "(observation, reward, done, info)"
            raise EnvironmentContractError(f"step() must return {shape}, got {_describe(out)}")
        if self.upstream_contract:
            observation, done, info = out
            info = _info(info)
            reward = info.get("reward", info.get("score", 0.0))
        else:
            observation, reward, done, info = out
            info = _info(info)
        reward = _reward(reward)
        if isinstance(done, float) or done not in (True, False):  # bools, 0/1, numpy bools
            raise EnvironmentContractError(f"step() returned done={done!r}; it must be a bool")
        done = bool(done)
        # A finished episode's last observation is never shown to the student, so it may be None.
        text = "" if (done and observation is None) else self._text(observation, "step()")
        return text, reward, done, info

    def expert_actions(self):
        fn = getattr(self.env, "expert_actions", None)
        return fn() if callable(fn) else None

    def close(self) -> None:
        fn = getattr(self.env, "close", None)
        if callable(fn):
            fn()


def _describe(value) -> str:
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple"
    return f"{type(value).__name__} {str(value)[:80]!r}"


def _info(info) -> dict:
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise EnvironmentContractError(f"step() returned info of type {type(info).__name__}; it must be a dict")
    return info


def _reward(reward) -> float:
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise EnvironmentContractError(f"step() returned reward {reward!r}; it must be a number")
    reward = float(reward)
    if not math.isfinite(reward):
        raise EnvironmentContractError(f"step() returned a non-finite reward ({reward})")
    return reward
