"""An environment that raises, hangs or breaks the step contract on a chosen call, to test that env faults end
only their episode (``rollout_interaction_env_path: flaky_env``, with ``tests/`` on the path)."""

import threading

from examples.agent_envs import build_env as build_any_env

# Hung calls wait on this; tests set it once the episodes are over so no thread outlives its test for long.
RELEASE = threading.Event()
CLOSED: list = []  # sample indices whose env was closed


class FlakyEnv:
    def __init__(self, inner, fail_at: int, hang_in: str | None = None, malformed_at: int = -1, index=None):
        self.inner, self.fail_at, self.steps = inner, fail_at, 0
        self.hang_in, self.malformed_at, self.index = hang_in, malformed_at, index

    def _maybe_hang(self, call):
        if self.hang_in == call:
            RELEASE.wait()

    def reset(self):
        self._maybe_hang("reset")
        if self.fail_at == 0:
            raise ConnectionError("JVM crashed during reset")
        return self.inner.reset()

    def step(self, response_text):
        self._maybe_hang("step")
        self.steps += 1
        if 0 < self.fail_at <= self.steps:
            raise RuntimeError(f"simulated crash at step {self.steps}")
        observation, done, info = self.inner.step(response_text)
        if self.steps == self.malformed_at:  # the removed factory contract's 4-tuple
            return observation, info["reward"], done, info
        return observation, done, info

    def format_observation(self, observation):
        return self.inner.format_observation(observation)

    def close(self):
        self._maybe_hang("close")
        CLOSED.append(self.index)
        self.inner.close()


def build_env(sample=None, args=None):
    """Fails at ``metadata["fail_at"]`` (0 = in reset, negative = never); ``hang_in`` names a call that
    blocks until :data:`RELEASE` ("build", "reset", "step", "close"); ``malformed_at`` a step that returns
    the wrong tuple."""
    meta = sample.metadata
    if meta.get("hang_in") == "build":
        RELEASE.wait()
    inner = build_any_env(sample, args)
    return FlakyEnv(
        inner, int(meta.get("fail_at", -1)), meta.get("hang_in"), int(meta.get("malformed_at", -1)), sample.index
    )
