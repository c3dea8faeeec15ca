"""ALFWorld (text) for users who have downloaded its data; never run in CI (the data is a download).

Task metadata: ``{"env": "alfworld", "game_file": path to a ``game.tw-pddl`` (absolute, or relative to
the data folder, e.g. "json_2.1.1/train/<task>/<trial>/game.tw-pddl"), "data_dir": optional,
"expert_actions": optional (TCOD's official prefix: the actions of ALFWorld's train_expert.jsonl),
"max_steps": optional (default 50, TCOD uses 30 student turns)}``.

The data folder comes from ``metadata["data_dir"]`` or ``$ALFWORLD_DATA``; without it ``build_env`` fails
at once with what to download. Games are TextWorld PDDL games played with ``textworld.start`` and
ALFWorld's ``AlfredDemangler`` (object names like "apple 1") through the TextWorld adapter, so reward,
done, invalid actions, thinking replies (the action follows ``</think>``) and errors behave as there.
Success: the game is won. Expert actions: the dataset's, else the game's walkthrough. Untested here
without the data; the error path is tested.
"""

from __future__ import annotations

from pathlib import Path

from examples.agent_envs.common import require_data_dir
from examples.agent_envs.puzzle import sample_metadata
from examples.agent_envs.textworld_env import TextWorldTextEnv

HOW_TO_GET = ("Install ALFWorld and fetch its data: `pip install alfworld` then `alfworld-download` "
              "(it writes the json_2.1.1 games and the PDDL logic into ~/.cache/alfworld by default).")
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"


class ALFWorldError(RuntimeError):
    """The ALFWorld game failed to load or to step; the episode cannot continue."""


class ALFWorldTextEnv(TextWorldTextEnv):
    error_class = ALFWorldError
    how_to_act = "one command, e.g. 'go to countertop 1' or 'take apple 1 from countertop 1'"

    def __init__(self, metadata: dict, data_dir: Path):
        super().__init__(metadata)
        game = metadata.get("game_file")
        if not game:
            raise ValueError(f"alfworld task metadata needs 'game_file' (a game.tw-pddl path), got {metadata}")
        path = Path(game).expanduser()
        self.game_path = path if path.is_absolute() else data_dir / path
        if not self.game_path.is_file():
            raise FileNotFoundError(f"ALFWorld game {str(self.game_path)!r} not found under {str(data_dir)!r}. "
                                    + HOW_TO_GET)
        try:
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        except ImportError as err:
            raise ImportError("ALFWorld data was found but the alfworld package is not installed: "
                              "pip install alfworld") from err
        self.wrappers = [AlfredDemangler]
        self.dataset_expert = metadata.get("expert_actions")

    def _game_path(self) -> Path:
        return self.game_path

    def _infos(self):
        import textworld

        # ALFWorld's PDDL games answer fewer infos than generated games; ask only for what is used.
        return textworld.EnvInfos(won=True, admissible_commands=True, extras=["walkthrough"])

    def _first_observation(self, state) -> str:
        # ALFWorld's first feedback is a banner, the room and "Your task is to: ...".
        return state.feedback.replace(WELCOME, "").strip()

    def expert_actions(self) -> list[str] | None:
        if self.dataset_expert:
            return list(self.dataset_expert)
        return super().expert_actions()


def build_env(sample=None, args=None):
    """Upstream's environment hook: ``rollout_interaction_env_path: examples.agent_envs.alfworld_env``."""
    del args
    metadata = sample_metadata(sample)
    data_dir = require_data_dir("ALFWorld", metadata, "ALFWORLD_DATA", HOW_TO_GET)
    return ALFWorldTextEnv(metadata, data_dir)


def task_metadata(seed: int, params: dict) -> dict:
    raise ValueError("ALFWorld tasks come from its downloaded game files, not from seeds: list them with "
                     "metadata {'env': 'alfworld', 'game_file': ...} rows (see README.md)")
