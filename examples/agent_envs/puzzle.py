"""Pieces this repository's environments share: the task of a sample, task seeds, the puzzle loop (hanoi).

``int_param`` and ``reply_action`` are the example's gridnav's (examples/multi_turn_tcod/envs/gridnav.py), which
needs no base class of its own; they are re-exported here for the adapters.

Environments follow the contract of ``examples/geo3k_vlm_multi_turn``: ``build_env(sample,
args)`` returns an object with ``reset() -> (observation, info)``, ``step(response_text) ->
(observation, done, info)`` (the step's reward in ``info["reward"]``, ``info["success"]``),
``format_observation(observation) -> message`` and ``close()``; TCOD's B2F may also read
``expert_actions()``.
"""

from __future__ import annotations

import json
import random
from typing import Any

from examples.multi_turn_tcod.envs.gridnav import THINK_CLOSE, THINK_OPEN, int_param, reply_action

__all__ = ["THINK_CLOSE", "THINK_OPEN", "PuzzleEnv", "int_param", "pick_params", "reply_action", "sample_metadata",
           "task_rng"]


def sample_metadata(sample) -> dict[str, Any]:
    """The task description of a sample: ``sample.metadata``, else a JSON object in ``sample.label``.

    Accepts a ``Sample``, any object with those attributes, or a plain dict (a jsonl data row).
    """
    if isinstance(sample, dict):
        metadata, label = sample.get("metadata"), sample.get("label")
    else:
        metadata, label = getattr(sample, "metadata", None), getattr(sample, "label", None)
    metadata = dict(metadata or {})
    if "env" not in metadata and isinstance(label, str) and label.lstrip().startswith("{"):
        try:
            metadata = {**json.loads(label), **metadata}
        except json.JSONDecodeError as err:
            raise ValueError(f"sample.label looks like a JSON task description but does not parse: {err}") from err
    return metadata


def task_rng(env_name: str, *parts) -> random.Random:
    # A string seed goes through sha512 in random.Random, so the task does not depend on PYTHONHASHSEED
    # or on the process: the same metadata gives the same task everywhere.
    return random.Random(":".join([env_name, *map(str, parts)]))


def pick_params(env_name: str, seed: int, params: dict, keys) -> dict:
    """Task metadata for the data generator: the env name, the seed and the parameters given."""
    return {"env": env_name, "seed": seed, **{k: params[k] for k in keys if params.get(k) is not None}}


def normalize_action(action: str) -> str:
    """Lower-case, single-spaced, first line only: models often add trailing newlines or spaces."""
    text = (action or "").strip().splitlines()
    return " ".join(text[0].lower().split()) if text else ""


class PuzzleEnv:
    """Episode bookkeeping for deterministic puzzles that know their optimal distance to the goal.

    Subclasses set ``name`` and implement ``_initial_state``, ``_parse`` (text -> move or None),
    ``_apply`` (state, move -> new state or an error string), ``_distance`` (optimal moves left),
    ``_solve`` (optimal move list from a state), ``_describe`` (the first observation) and
    ``_observe`` (the per-turn observation), plus ``valid_actions_hint``.

    Reward: 1.0 on the step that solves the task, else 0.0, plus ``shaping * (distance decrease)``
    when the task metadata sets ``shaping`` (default 0: sparse). Every step, invalid ones included,
    counts towards ``max_steps`` so an episode always ends.
    """

    name = "puzzle"
    valid_actions_hint = ""
    blocking = False  # pure Python and fast: the agent loop calls it on the event loop, not in a thread

    def __init__(self, metadata: dict):
        self.metadata = dict(metadata)
        self.shaping = float(self.metadata.get("shaping", 0.0))
        self._start = self._initial_state()
        self._expert = self._solve(self._start)
        default_steps = 2 * len(self._expert) + 4
        self.max_steps = int_param(self.metadata, "max_steps", default_steps, 1)
        self.state = None
        self.steps = 0
        self.done = True

    # --------------------------------------------------------------- contract
    def reset(self):
        self.state = self._start
        self.steps = 0
        self.done = False
        return self._describe(self.state), {}

    def step(self, response_text: str):
        if self.state is None:
            raise RuntimeError(f"{self.name}: step() called before reset()")
        if self.done:
            raise RuntimeError(f"{self.name}: step() called after the episode ended; call reset()")
        self.steps += 1
        info: dict[str, Any] = {"invalid_action": False, "success": False, "steps": self.steps, "reward": 0.0}
        action = reply_action(response_text)
        move = None if action is None else self._parse(normalize_action(action))
        if action is None:
            info["invalid_action"] = True
            observation = (
                f"No action: the reply ended inside {THINK_OPEN}. Think briefly, close with {THINK_CLOSE}, "
                f"then give one action: {self.valid_actions_hint}"
            )
        elif move is None:
            info["invalid_action"] = True
            observation = f"Invalid action '{action.strip()[:40]}'. Valid actions: {self.valid_actions_hint}"
        else:
            before = self._distance(self.state)
            result = self._apply(self.state, move)
            if isinstance(result, str):  # well-formed but not possible here (wall, illegal move)
                info["invalid_action"] = True
                observation = f"{result}. {self._observe(self.state)}"
            else:
                self.state = result
                info["reward"] += self.shaping * (before - self._distance(self.state))
                observation = self._observe(self.state)
        if self._distance(self.state) == 0:
            info["success"] = True
            info["reward"] += 1.0
            self.done = True
            observation = f"{observation} solved"
        elif self.steps >= self.max_steps:
            self.done = True
            info["out_of_steps"] = True
            observation = f"{observation} out of steps"
        return observation, self.done, info

    def format_observation(self, observation: str) -> dict:
        return {"role": "user", "content": observation}

    def close(self) -> None:
        self.state = None

    def expert_actions(self) -> list[str]:
        """The optimal action sequence from the reset state (the same for every call)."""
        return list(self._expert)
