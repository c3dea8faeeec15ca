"""The one piece of upstream's geo3k multi-turn example that ``examples/multi_turn_tcod`` reuses, for this runtime.

Upstream slime ships ``examples/geo3k_vlm_multi_turn/rollout.py`` with ``_load_env_module(env_path)``: the module
``--rollout-interaction-env-path`` names, as a dotted module path or as a ``.py`` file. The TCOD example imports it
from there (the PR adds no loader of its own); this file gives this runtime the same name and behaviour, written
here, so that the example's files run unchanged in both trees. Nothing else of geo3k's example is here.
"""

import importlib
import importlib.util
import sys
from pathlib import Path


def _load_env_module(env_path: str):
    """The module at ``env_path``: a ``.py`` file that exists is executed as ``rollout_env_<stem>`` (each call
    executes it again, as upstream's does), anything else is imported as a dotted module path."""
    path = Path(env_path)
    if path.suffix != ".py" or not path.exists():
        return importlib.import_module(env_path)
    spec = importlib.util.spec_from_file_location(f"rollout_env_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the environment module {env_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
