"""WebShop (text mode) for users who have set it up locally; never run in CI (its data is a download).

Task metadata: ``{"env": "webshop", "session": int (goal index), "data_dir": optional, "num_products":
optional (must match the search index you built), "expert_actions": optional (e.g. from WebShop's human
trajectories), "max_steps": optional (default 15, TCOD's WebShop horizon)}``.

WebShop is not on PyPI: the data folder (``metadata["data_dir"]`` or ``$WEBSHOP_DATA``) is a checkout of
the WebShop repository after its setup script fetched the product data and built the search index.
Without it ``build_env`` fails at once with what to do. Actions are WebShop's ``search[...]`` and
``click[...]``, read from what follows ``</think>`` in the reply (a reply that ends inside its think
block never reaches WebShop: an invalid step, answered with an observation saying so); reward
(``info["reward"]``) is WebShop's purchase score in [0, 1] at the end; success: score 1. An action
that is not available on the current page is flagged ``invalid_action``; every step counts towards
``max_steps``. Loading the product catalogue
is slow, so catalogues are pooled per process. Untested here without the data; the error path is tested.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from examples.agent_envs.common import ResourcePool, no_action_observation, require_data_dir, user_message
from examples.agent_envs.puzzle import int_param, reply_action, sample_metadata

HOW_TO_GET = ("Set up WebShop locally: `git clone https://github.com/princeton-nlp/WebShop`, then run its "
              "`./setup.sh -d small` (or `-d all`), which downloads the product data and builds the search "
              "index; the data folder is that checkout.")
_ACTION = re.compile(r"^(search|click)\[(.+)\]$", re.IGNORECASE)
HOW_TO_ACT = "search[QUERY] or click[BUTTON]"


class WebShopError(RuntimeError):
    """WebShop failed to load or to step; the episode cannot continue."""


def _check_checkout(data_dir: Path) -> None:
    if not (data_dir / "web_agent_site").is_dir():
        raise FileNotFoundError(f"{str(data_dir)!r} is not a WebShop checkout (no web_agent_site/ folder). "
                                + HOW_TO_GET)
    if not any((data_dir / "data").glob("items_*.json")):
        raise FileNotFoundError(f"WebShop checkout {str(data_dir)!r} has no product data (data/items_*.json): "
                                "its setup script has not been run. " + HOW_TO_GET)


_pools: dict[tuple, ResourcePool] = {}


def _catalogue_pool(data_dir: Path, num_products: int | None) -> ResourcePool:
    key = (str(data_dir), num_products)
    if key not in _pools:
        def create():
            if str(data_dir) not in sys.path:
                sys.path.insert(0, str(data_dir))  # WebShop is a repository, not an installed package
            from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv

            kwargs = {"num_products": num_products} if num_products else {}
            return WebAgentTextEnv(observation_mode="text", human_goals=True, **kwargs)

        _pools[key] = ResourcePool(create, lambda env: env.close(), max_idle=4)
    return _pools[key]


class WebShopTextEnv:
    def __init__(self, metadata: dict, data_dir: Path):
        self.session = int_param(metadata, "session", metadata.get("seed"), 0)
        self.max_steps = int_param(metadata, "max_steps", 15, 1)
        self.dataset_expert = metadata.get("expert_actions")
        self.pool = _catalogue_pool(data_dir, metadata.get("num_products"))
        self._env = None

    def _fail(self, what, err):
        env, self._env = self._env, None
        if env is not None:
            self.pool.discard(env)
        raise WebShopError(f"WebShop session {self.session}: {what} failed with {type(err).__name__}: {err}") from err

    def reset(self):
        try:
            if self._env is None:
                self._env = self.pool.acquire()
            observation, _ = self._env.reset(session=self.session)
        except Exception as err:
            self._fail("reset", err)
        self.steps = 0
        return str(observation), {}

    def _available(self, action: str) -> bool:
        match = _ACTION.match(action)
        if not match:
            return False
        options = self._env.get_available_actions()
        if match.group(1).lower() == "search":
            return bool(options.get("has_search_bar"))
        return match.group(2).lower() in {c.lower() for c in options.get("clickables", [])}

    def step(self, response_text: str):
        if self._env is None:
            raise RuntimeError("WebShop: step() called before reset() (or after close() / a failure)")
        action = reply_action(response_text)
        if action is None:
            self.steps += 1
            info = {"reward": 0.0, "success": False, "invalid_action": True}
            done = self.steps >= self.max_steps
            if done:
                info["out_of_steps"] = True
            return no_action_observation(HOW_TO_ACT), done, info
        action = action.strip()
        try:
            valid = self._available(action)
            observation, reward, done, _ = self._env.step(action)
        except Exception as err:
            self._fail(f"step({action[:80]!r})", err)
        self.steps += 1
        reward = float(reward or 0.0)
        info = {"reward": reward, "success": bool(done) and reward >= 1.0, "invalid_action": not valid}
        if not done and self.steps >= self.max_steps:
            done, info["out_of_steps"] = True, True
        return str(observation), bool(done), info

    def format_observation(self, observation: str) -> dict:
        return user_message(observation)

    def expert_actions(self) -> list[str] | None:
        return list(self.dataset_expert) if self.dataset_expert else None

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            self.pool.release(env)


def build_env(sample=None, args=None):
    """Upstream's environment hook: ``rollout_interaction_env_path: examples.agent_envs.webshop_env``."""
    del args
    metadata = sample_metadata(sample)
    data_dir = require_data_dir("WebShop", metadata, "WEBSHOP_DATA", HOW_TO_GET)
    _check_checkout(data_dir)
    return WebShopTextEnv(metadata, data_dir)


def task_metadata(seed: int, params: dict) -> dict:
    """Task number ``seed`` = WebShop goal (session) ``seed``; expert actions must come from your data."""
    return {"env": "webshop", "session": seed}
