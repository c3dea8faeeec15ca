"""ScienceWorld (pip ``scienceworld``, offline, runs a Java 17+ server) behind upstream's environment contract.

Task metadata: ``{"env": "scienceworld", "task": NAME (e.g. "find-non-living-thing"), "variation": int,
"simplification": optional comma list (e.g. "easy"), "max_steps": optional}``; ``seed`` is accepted as
the variation when ``variation`` is absent (the data generator numbers tasks by seed).

* first observation: the task description, then the result of "look around";
* action: what follows ``</think>`` in the reply (``reply_action``); a reply that ends inside its think
  block never reaches the game: it is an invalid step answered with an observation saying so;
* reward (``info["reward"]``): the change of ScienceWorld's 0..100 score divided by 100 (the rewards of
  an episode sum to the final score / 100); ``info["score"]`` carries the raw score;
* done: ScienceWorld's completed flag (task finished, failed with a negative score, or step limit; every
  step, a thought cut short too, counts towards the limit); success: score 100;
* expert actions: ``get_gold_action_sequence()`` of the task (loaded with ``generateGoldPath=True``);
* an unparseable action is ScienceWorld's own "No known action matches that input." observation with
  ``info["invalid_action"] = True``;
* anything that goes wrong inside ScienceWorld or its JVM is raised as ``ScienceWorldError`` naming the
  task, so the agent loop can end that episode as FAILED.

Starting a JVM takes seconds, so finished environments hand their JVM to a small per-process pool and
the next episode reuses it; a JVM that raised is discarded, never reused.
"""

from __future__ import annotations

import logging
import os

from examples.agent_envs.common import ResourcePool, no_action_observation, user_message
from examples.agent_envs.puzzle import int_param, reply_action, sample_metadata

NO_MATCH = "No known action matches that input."
HOW_TO_ACT = "a ScienceWorld command such as 'look around' or 'focus on OBJECT'"
# py4j (ScienceWorld's bridge to its JVM) logs harmless shutdown races as INFO tracebacks at process exit.
logging.getLogger("py4j").setLevel(logging.WARNING)


class ScienceWorldError(RuntimeError):
    """ScienceWorld or its Java server failed; the episode cannot continue."""


def _start_server():
    try:
        from scienceworld import ScienceWorldEnv
    except ImportError as err:
        raise ScienceWorldError(
            "ScienceWorld is not installed: pip install scienceworld (or the project's "
            "[envs] extra); it also needs Java 17+ on PATH"
        ) from err
    try:
        return ScienceWorldEnv("", envStepLimit=100)
    except Exception as err:
        raise ScienceWorldError(
            f"could not start ScienceWorld's Java server ({type(err).__name__}: {err}); "
            "check that Java 17+ is installed (`java -version`)"
        ) from err


SERVERS = ResourcePool(
    _start_server, lambda server: server.close(), max_idle=int(os.environ.get("SCIENCEWORLD_POOL_SIZE", "8"))
)


class ScienceWorldTextEnv:
    def __init__(self, metadata: dict):
        self.task = metadata.get("task")
        if not self.task:
            raise ValueError(f"scienceworld task metadata needs 'task' (a ScienceWorld task name), got {metadata}")
        self.variation = int_param(metadata, "variation", metadata.get("seed", 0), 0)
        self.simplification = str(metadata.get("simplification", "") or "")
        self.max_steps = metadata.get("max_steps")
        self._server = None
        self._gold: list[str] | None = None
        self._score = 0
        self.steps, self.step_limit = 0, 0

    def _fail(self, what: str, err: Exception):
        # Drop the server: after an exception its JVM state is unknown (or the JVM is gone).
        server, self._server = self._server, None
        if server is not None:
            SERVERS.discard(server)
        raise ScienceWorldError(
            f"ScienceWorld task {self.task!r} variation {self.variation}: {what} failed with "
            f"{type(err).__name__}: {err} (the Java server may have crashed; this episode cannot continue)"
        ) from err

    def reset(self):
        if self._server is None:
            self._server = SERVERS.acquire()
        try:
            self._server.load(self.task, self.variation, self.simplification, generateGoldPath=True)
            gold = list(self._server.get_gold_action_sequence())
            self._gold = None if (not gold or gold[0].startswith("ERROR")) else gold
            self.step_limit = int(self.max_steps or max(100, 2 * len(self._gold or [])))
            self._server.envStepLimit = self.step_limit
            observation, info = self._server.reset()
        except Exception as err:
            self._fail("reset", err)
        self._score = int(info.get("score", 0))
        self.steps = 0
        return f"{info['taskDesc'].strip()}\n{observation.strip()}", {"score": self._score}

    def step(self, response_text: str):
        if self._server is None:
            raise RuntimeError("ScienceWorld: step() called before reset() (or after close() / a failure)")
        self.steps += 1
        action = reply_action(response_text)
        if action is None:
            info = {"reward": 0.0, "score": self._score, "success": False, "invalid_action": True}
            # The game's own step limit never sees this step, so the limit is enforced here too.
            return no_action_observation(HOW_TO_ACT), self.steps >= self.step_limit, info
        text = action.strip()
        try:
            observation, _, completed, info = self._server.step(text)
        except Exception as err:
            self._fail(f"step({text[:80]!r})", err)
        score = int(info["score"])
        reward = (score - self._score) / 100.0
        self._score = score
        info = {
            "reward": reward,
            "score": score,
            "moves": info.get("moves"),
            "success": score >= 100,
            "invalid_action": observation.strip() == NO_MATCH,
        }
        return observation.strip(), bool(completed) or self.steps >= self.step_limit, info

    def format_observation(self, observation: str) -> dict:
        return user_message(observation)

    def expert_actions(self) -> list[str] | None:
        return list(self._gold) if self._gold is not None else None

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            SERVERS.release(server)


def build_env(sample=None, args=None):
    """Upstream's environment hook: ``rollout_interaction_env_path: examples.agent_envs.scienceworld_env``."""
    del args
    return ScienceWorldTextEnv(sample_metadata(sample))


def task_metadata(seed: int, params: dict) -> dict:
    """Task number ``seed`` = variation ``seed`` of ``--task`` (default: the short find-non-living-thing)."""
    metadata = {"env": "scienceworld", "task": params.get("task") or "find-non-living-thing", "variation": seed}
    for key in ("simplification", "max_steps"):
        if params.get(key) is not None:
            metadata[key] = params[key]
    return metadata
