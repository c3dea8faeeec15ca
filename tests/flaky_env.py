"""An environment that raises, hangs or returns a NaN reward on a chosen call, to test that env faults end
only their episode."""

import threading

from examples.agent_envs import make_env as make_builtin_env

# Hung calls wait on this; tests set it at teardown so no thread outlives its test for long.
RELEASE = threading.Event()
CLOSED: list = []  # sample indices whose env was closed


class FlakyEnv:
    def __init__(self, inner, fail_at: int, hang_in: str | None = None, nan_at: int = -1, index=None):
        self.inner, self.fail_at, self.steps = inner, fail_at, 0
        self.hang_in, self.nan_at, self.index = hang_in, nan_at, index

    def _maybe_hang(self, call):
        if self.hang_in == call:
            RELEASE.wait()

    def reset(self):
        self._maybe_hang("reset")
        if self.fail_at == 0:
            raise ConnectionError("JVM crashed during reset")
        return self.inner.reset()

    def step(self, action):
        self._maybe_hang("step")
        self.steps += 1
        if 0 < self.fail_at <= self.steps:
            raise RuntimeError(f"simulated crash at step {self.steps}")
        observation, reward, done, info = self.inner.step(action)
        return observation, float("nan") if self.steps == self.nan_at else reward, done, info

    def close(self):
        self._maybe_hang("close")
        CLOSED.append(self.index)
        self.inner.close()


def make_env(args, sample):
    """Fails at ``metadata["fail_at"]`` (0 = in reset, negative = never); ``hang_in`` names a call that
    blocks until :data:`RELEASE` ("build", "reset", "step", "close"); ``nan_at`` a step whose reward is NaN."""
    meta = sample.metadata
    if meta.get("hang_in") == "build":
        RELEASE.wait()
    return FlakyEnv(make_builtin_env(args, sample), int(meta.get("fail_at", -1)), meta.get("hang_in"),
                    int(meta.get("nan_at", -1)), sample.index)
