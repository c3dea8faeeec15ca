"""Stepping an environment through a list of replies, shared by the environment tests."""


def play(env, replies):
    """(observation, reward, done, info) per reply, the reward read from ``info["reward"]``."""
    out = []
    for reply in replies:
        observation, done, info = env.step(reply)
        out.append((observation, info["reward"], done, info))
    return out
