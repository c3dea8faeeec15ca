"""An environment that raises on a chosen step, to test that env faults end only their episode."""

from examples.multi_turn_tcod.envs import make_env as make_builtin_env


class FlakyEnv:
    def __init__(self, inner, fail_at: int):
        self.inner, self.fail_at, self.steps = inner, fail_at, 0

    def reset(self):
        if self.fail_at == 0:
            raise ConnectionError("JVM crashed during reset")
        return self.inner.reset()

    def step(self, action):
        self.steps += 1
        if 0 < self.fail_at <= self.steps:
            raise RuntimeError(f"simulated crash at step {self.steps}")
        return self.inner.step(action)

    def close(self):
        self.inner.close()


def make_env(args, sample):
    """Fails at ``metadata["fail_at"]`` (0 = in reset, negative = never)."""
    return FlakyEnv(make_builtin_env(args, sample), int(sample.metadata.get("fail_at", -1)))
