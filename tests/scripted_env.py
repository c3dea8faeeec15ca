"""A test environment whose episode does not depend on the actions, so any teacher (even an untrained
tiny model) has a known episode length, and whose replay can be made to differ on purpose.

Task metadata: ``length`` (the step on which the episode ends), ``succeed`` (bool, default true: the
last step reports success), ``noisy_from`` (from that step on, 0 = the reset, observations carry a per-instance
counter, so a replay in a new instance shows observations the recorded episode never had). No ``expert_actions()``.
``rollout_interaction_env_path: scripted_env`` (upstream's ``build_env`` contract, ``tests/`` on the path).
"""

import itertools

_INSTANCES = itertools.count()
STEPPED: list = []  # (sample index, response text) of every step, to check that replays re-execute actions


class ScriptedEnv:
    def __init__(self, metadata, index):
        self.length = int(metadata["length"])
        self.succeed = bool(metadata.get("succeed", True))
        self.noisy_from = metadata.get("noisy_from")
        self.noise = f" #{next(_INSTANCES)}"
        self.index, self.t = index, 0

    def reset(self):
        self.t = 0
        return f"go {self.length}{self._noise()}", {}

    def _noise(self):
        return self.noise if self.noisy_from is not None and self.t >= self.noisy_from else ""

    def step(self, response_text):
        self.t += 1
        STEPPED.append((self.index, response_text))
        done = self.t >= self.length
        success = done and self.succeed
        return f"t{self.t}{self._noise()}", done, {"reward": float(success), "success": success}

    def format_observation(self, observation):
        return {"role": "user", "content": observation}

    def close(self):
        pass


def build_env(sample=None, args=None):
    del args
    return ScriptedEnv(sample.metadata, sample.index)
