"""Every task row names an environment that the dispatching environment module serves.

``--rollout-interaction-env-path examples.agent_envs`` builds each sample's environment from its
``metadata["env"]``; a row naming another (a typo, a set made for another tree) fails its episode in
every rollout, one by one. A module that dispatches this way exposes ``ENV_MODULES`` (name -> module);
others are not checked.
"""

from __future__ import annotations

from slime.arguments.argument_error import ArgumentError
from slime.launch.task_rows import metadata_of, rows


def check_task_envs(args, files) -> None:
    """``files``: (flag, path) of every prompt file (``checks.data_files``)."""
    path = getattr(args, "rollout_interaction_env_path", None)
    if not path:
        return
    from examples.multi_turn_tcod.rollout import load_env_module

    known = getattr(load_env_module(path), "ENV_MODULES", None)
    if not isinstance(known, dict):
        return
    for flag, data_path in files:
        names = [(n, metadata_of(row, args.metadata_key).get("env")) for n, row in rows(data_path)]
        bad = [(n, env) for n, env in names if not (isinstance(env, str) and env in known)]
        if bad:
            n, env = bad[0]
            unit = "row" if data_path.endswith(".parquet") else "line"
            more = f"; {len(bad) - 1} more row(s) like it" if len(bad) > 1 else ""
            serves = f"--rollout-interaction-env-path {path} (known: {', '.join(sorted(known))})"
            what = (f"environment {env!r} is served by no module of {serves}" if env else
                    f"no metadata['env'], by which {serves} picks the environment")
            raise ArgumentError(f"{flag} {data_path} {unit} {n}: {what}{more}")
