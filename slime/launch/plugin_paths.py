"""Every dotted plugin path of a run imports, checked before Ray starts (``--dry-run`` included).

A misspelled module or function would otherwise fail only when the first rollout calls it, after the
engines and the trainer are up (or, for the environment, fail every episode one by one).
"""

from __future__ import annotations

import importlib
import traceback

from slime.arguments.argument_error import ArgumentError
from slime.utils.misc import load_function

# attribute -> flag; each names a function by dotted path.
FUNCTION_PATHS = {
    "rollout_function_path": "--rollout-function-path",
    "custom_generate_function_path": "--custom-generate-function-path",
    "custom_rm_path": "--custom-rm-path",
    "custom_reward_post_process_path": "--custom-reward-post-process-path",
    "custom_rollout_log_function_path": "--custom-rollout-log-function-path",
}


def _import_error(flag: str, path: str, err: Exception) -> ArgumentError:
    return ArgumentError(f"{flag} {path!r} does not import: {type(err).__name__}: {err}")


def raised_at_import(flag: str, path: str, err: Exception) -> ArgumentError:
    """A module whose own code raised while it was imported: the exception, its first line, and where."""
    frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    where = f" (at {frame.filename}:{frame.lineno})" if frame else ""
    first = (str(err).splitlines() or [""])[0]
    return ArgumentError(f"{flag} {path!r} raised while importing: {type(err).__name__}: {first}{where}")


def check_plugin_paths(args) -> None:
    for name, flag in FUNCTION_PATHS.items():
        path = getattr(args, name, None)
        if not path:
            continue
        try:
            fn = load_function(path)
        except (ImportError, AttributeError, ValueError) as err:
            raise _import_error(flag, path, err) from None
        except Exception as err:  # noqa: BLE001 - the plugin's own module failed: one line, not a traceback
            raise raised_at_import(flag, path, err) from None
        if not callable(fn):
            raise ArgumentError(f"{flag} {path!r} is not callable")
    env = getattr(args, "rollout_interaction_env_path", None)
    if env and not env.endswith(".py"):
        # A module exposing build_env (upstream's contract), or a factory function's dotted path.
        try:
            importlib.import_module(env)
        except ModuleNotFoundError as err:
            if err.name != env:
                raise _import_error("--rollout-interaction-env-path", env, err) from None
            try:
                load_function(env)
            except (ImportError, AttributeError, ValueError) as err2:
                raise _import_error("--rollout-interaction-env-path", env, err2) from None
        except Exception as err:  # noqa: BLE001 - as above
            raise raised_at_import("--rollout-interaction-env-path", env, err) from None
