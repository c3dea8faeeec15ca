"""The environment behind ``rollout_interaction_env_path``, in one shape for the agent loop.

Two contracts are accepted:

* **upstream slime's** (``examples/geo3k_vlm_multi_turn``): the path names a module (or a ``.py``
  file) exposing ``build_env(sample, args)``. Its env has ``reset()``, ``step(response_text) ->
  (observation, done, info)``, ``format_observation(observation) -> message`` and ``close()``. The
  step reward is read from ``info["reward"]`` (else ``info["score"]``, else 0); success from
  ``info["success"]``. When ``reset()`` gives no observation, the task text is ``sample.prompt``.
* **a factory**: the path names a callable ``make_env(args, sample)`` whose env has
  ``reset() -> str``, ``step(action) -> (observation, reward, done, info)``, ``close()``.

Either may offer ``expert_actions() -> list[str]`` (TCOD's B2F prefix). A malformed return raises
:class:`EnvironmentContractError` naming the method, and every call runs on a daemon thread bounded by
``env_step_timeout`` seconds: a fault or a hang ends that episode only (:class:`EnvironmentFault`).
"""

import asyncio
import importlib
import importlib.util
import inspect
import logging
import math
import sys
import threading
from pathlib import Path

from slime.utils.misc import load_function

logger = logging.getLogger(__name__)

DEFAULT_ENV_STEP_TIMEOUT = 300.0


class EnvironmentContractError(TypeError):
    """An environment returned something its contract does not allow."""


class EnvironmentFault(RuntimeError):
    """The environment raised, hung or broke its contract: the episode fails, the run goes on."""


class EnvironmentTimeout(EnvironmentFault):
    """An environment call did not return within ``env_step_timeout`` seconds."""


def env_step_timeout(args) -> float:
    return float(getattr(args, "env_step_timeout", None) or DEFAULT_ENV_STEP_TIMEOUT)


def _in_daemon_thread(fn, args) -> asyncio.Future:
    """Run ``fn(*args)`` on a daemon thread; the future gets ``(True, result)`` or ``(False, error)``.

    Not ``asyncio.to_thread``: its threads are joined at shutdown, so one call that never returns would
    keep a stopped run alive. Errors travel as values so that the env's own TimeoutError is not taken
    for our bound running out.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def deliver(outcome):
        if not future.done():
            future.set_result(outcome)

    def run():
        try:
            outcome = (True, fn(*args))
        except BaseException as err:  # noqa: B036 - handed to the awaiting coroutine
            outcome = (False, err)
        try:
            loop.call_soon_threadsafe(deliver, outcome)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this call any more

    threading.Thread(target=run, name=f"env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


async def call_env(seconds: float, what: str, fn, *args):
    """``fn(*args)`` off the event loop (environments may block: a JVM, a game engine), bounded in time."""
    try:
        ok, value = await asyncio.wait_for(_in_daemon_thread(fn, args), seconds)
    except asyncio.TimeoutError:
        raise EnvironmentTimeout(f"{what} did not return within {seconds:g} s (env_step_timeout)") from None
    if ok:
        return value
    if isinstance(value, EnvironmentContractError):
        raise EnvironmentFault(f"{what}: environment contract: {value}") from value
    if isinstance(value, Exception):
        raise EnvironmentFault(f"{what}: {type(value).__name__}: {value}") from value
    raise value  # KeyboardInterrupt / SystemExit raised inside the env stop the run


async def close_env(env, seconds: float, sample):
    """Close ``env``; returns the timeout error if close() hung. A close that raises is only logged."""
    try:
        await call_env(seconds, f"{env.label}: close()", env.close)
    except EnvironmentTimeout as err:
        return err
    except EnvironmentFault as err:
        logger.warning("env.close() raised for sample %s: %s", sample.index, err)
    return None


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


def _keyword_call(build):
    """``build_env`` called by keyword as upstream's geo3k rollout does; positionally if its names differ."""
    try:
        inspect.signature(build).bind(sample=None, args=None)
    except (TypeError, ValueError):
        return build
    return lambda sample, args: build(sample=sample, args=args)


def _resolve(path: str):
    """(kind, callable): ("build_env", fn) for upstream's module contract, ("make_env", fn) otherwise."""
    if path.endswith(".py") and Path(path).is_file():  # a file path, as upstream's geo3k example accepts
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
            raise ValueError(
                f"rollout_interaction_env_path {path!r} is a module without a callable build_env(sample, args)"
            )
        return "build_env", _keyword_call(build)
    factory = load_function(path)
    if not callable(factory):
        raise ValueError(f"rollout_interaction_env_path {path!r} is not callable")
    return "make_env", factory


def build_interaction_env(args, sample):
    """Build the environment of ``sample``'s task (blocking: call it off the event loop)."""
    path = getattr(args, "rollout_interaction_env_path", None)
    if not path:
        raise ValueError(
            "the multi-turn rollout needs rollout_interaction_env_path (a module exposing build_env(sample, args))"
        )
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
        raise EnvironmentContractError(
            "format_observation returned non-text content (images, ...): the multi-turn TCOD loop is text-only"
        )
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
        raise EnvironmentContractError(
            f"{method} returned an observation of type {type(observation).__name__}, not text"
        )

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


def expert_actions_for(env, sample) -> list[str] | None:
    """The dataset's expert actions (``metadata["expert_actions"]``) first, else the env's gold path."""
    actions = (sample.metadata or {}).get("expert_actions")
    if actions is None and callable(getattr(env, "expert_actions", None)):
        actions = env.expert_actions()
    return list(actions) if actions is not None else None


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
