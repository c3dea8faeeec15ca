"""TextWorld (pip ``textworld``, offline) games generated locally, behind upstream's environment contract.

Task metadata: ``{"env": "textworld", "seed": int, "rooms": int (default 2), "objects": int (default 3),
"quest_length": int (default 3), "max_steps": optional (default 50), "games_dir": optional}``.

The game for a seed and size is generated once with TextWorld's generator (``make_game`` then
``compile_game``, which runs the Inform 7 compiler bundled with the package) into a cache folder:
``games_dir``, else ``$TEXTWORLD_GAMES_DIR``, else ``~/.cache/slime-tcod/textworld``. It is played
through ``textworld.start``.

* first observation: the game's objective, then the room description;
* action: what follows ``</think>`` in the reply (``reply_action``); a reply that ends inside its think
  block never reaches the game: it is an invalid step answered with an observation saying so;
* reward (``info["reward"]``): the change in game points divided by the game's max score; success: the
  game is won;
* invalid action: a command that was not in the previous state's admissible commands (TextWorld
  answers those itself, e.g. "That's not a verb I recognise.");
* every step, invalid ones included, counts towards ``max_steps``;
* expert actions: the game's walkthrough;
* any TextWorld failure is raised as ``TextWorldError`` naming the game file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from examples.agent_envs.common import close_quietly, no_action_observation, user_message
from examples.agent_envs.puzzle import int_param, pick_params, reply_action, sample_metadata

_generate_lock = threading.Lock()


class TextWorldError(RuntimeError):
    """TextWorld failed to generate, start or step a game; the episode cannot continue."""


def games_dir(metadata: dict) -> Path:
    folder = metadata.get("games_dir") or os.environ.get("TEXTWORLD_GAMES_DIR")
    return Path(folder) if folder else Path.home() / ".cache" / "slime-tcod" / "textworld"


def game_file(metadata: dict) -> Path:
    """The compiled game of this task, generated on first use (atomically, so parallel users agree)."""
    seed = int_param(metadata, "seed", None, 0)
    rooms = int_param(metadata, "rooms", 2, 1, 20)
    objects = int_param(metadata, "objects", 3, 0, 50)
    quest_length = int_param(metadata, "quest_length", 3, 1, 20)
    folder = games_dir(metadata)
    name = f"tw_r{rooms}_o{objects}_q{quest_length}_s{seed}"
    path = folder / f"{name}.z8"
    with _generate_lock:
        if path.exists():
            return path
        try:
            from textworld import GameOptions
            from textworld.generator import compile_game, make_game
        except ImportError as err:
            raise TextWorldError("TextWorld is not installed: pip install textworld (or the [envs] extra)") from err
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))
        try:
            options = GameOptions()
            options.seeds = seed
            options.nb_rooms, options.nb_objects, options.quest_length = rooms, objects, quest_length
            options.path = str(staging / f"{name}.z8")
            compiled = Path(compile_game(make_game(options), options))
            # The .json (walkthrough, infos) goes first: a .z8 in place means its json is too.
            os.replace(compiled.with_suffix(".json"), path.with_suffix(".json"))
            os.replace(compiled, path)
        except Exception as err:
            raise TextWorldError(f"TextWorld could not generate game {name} in {folder}: "
                                 f"{type(err).__name__}: {err}") from err
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def clean_feedback(text: str) -> str:
    # The Z-machine echoes a prompt and a status line ("\n>   -= Room =-0/1") after each answer.
    cut = text.rfind("\n>")
    return (text[:cut] if cut >= 0 else text).strip()


class TextWorldTextEnv:
    """A TextWorld game behind the contract; ALFWorld's adapter reuses it with its own game and wrappers."""

    error_class = TextWorldError
    wrappers: list = []
    how_to_act = "one command, e.g. 'go east' or 'take key'"

    def __init__(self, metadata: dict):
        self.metadata = dict(metadata)
        self.max_steps = int_param(self.metadata, "max_steps", 50, 1)
        self.path = None
        self._env = None
        self._state = None

    def _fail(self, what: str, err: Exception):
        self.close()
        raise self.error_class(f"game {self.path}: {what} failed with {type(err).__name__}: {err}") from err

    def _game_path(self) -> Path:
        return game_file(self.metadata)

    def _first_observation(self, state) -> str:
        return f"{state['objective'].strip()}\n{state['description'].strip()}"

    def _infos(self):
        import textworld

        return textworld.EnvInfos(admissible_commands=True, won=True, lost=True, description=True,
                                  objective=True, max_score=True, score=True, extras=["walkthrough"])

    def reset(self):
        self.path = self._game_path()
        try:
            import textworld

            if self._env is None:
                self._env = textworld.start(str(self.path), request_infos=self._infos(), wrappers=self.wrappers)
            self._state = self._env.reset()
        except Exception as err:
            self._fail("reset", err)
        self.steps, self.score, self.done = 0, 0, False
        return self._first_observation(self._state), {}

    def step(self, response_text: str):
        if self._state is None:
            raise RuntimeError("TextWorld: step() called before reset() (or after close() / a failure)")
        action = reply_action(response_text)
        if action is None:
            self.steps += 1
            info = {"reward": 0.0, "success": False, "lost": False, "score": self.score, "invalid_action": True}
            done = self.steps >= self.max_steps
            if done:
                info["out_of_steps"] = True
            return no_action_observation(self.how_to_act), done, info
        command = " ".join(action.strip().split())
        admissible = {c.lower() for c in self._state["admissible_commands"] or []}
        try:
            self._state, score, done = self._env.step(command)
        except Exception as err:
            self._fail(f"step({command[:80]!r})", err)
        self.steps += 1
        max_score = max(1, int(self._state.get("max_score") or 1))
        reward = (score - self.score) / max_score
        self.score = score
        won = bool(self._state["won"])
        info = {"reward": reward, "success": won, "lost": bool(self._state.get("lost")), "score": score,
                "invalid_action": command.lower() not in admissible}
        if not done and self.steps >= self.max_steps:
            done, info["out_of_steps"] = True, True
        return clean_feedback(self._state.feedback), bool(done), info

    def format_observation(self, observation: str) -> dict:
        return user_message(observation)

    def expert_actions(self) -> list[str] | None:
        if self._state is None:
            return None
        walkthrough = self._state.get("extra.walkthrough")
        return list(walkthrough) if walkthrough else None

    def close(self) -> None:
        env, self._env, self._state = self._env, None, None
        close_quietly(env)


def build_env(sample=None, args=None):
    """Upstream's environment hook: ``rollout_interaction_env_path: examples.agent_envs.textworld_env``."""
    del args
    return TextWorldTextEnv(sample_metadata(sample))


def task_metadata(seed: int, params: dict) -> dict:
    return pick_params("textworld", seed, params, ("rooms", "objects", "quest_length", "max_steps"))
