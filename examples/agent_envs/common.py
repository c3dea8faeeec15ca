"""Helpers of this repository's environment adapters that need downloaded data or a game engine."""

from __future__ import annotations

import os
from pathlib import Path


def require_data_dir(env_name: str, metadata: dict, env_var: str, how_to_get: str) -> Path:
    """The folder of downloaded data (``metadata["data_dir"]``, else ``$ENV_VAR``), or a clear error.

    Raised when the environment is built, so a run without the data stops at start-up and says what to
    download and where to point, instead of failing every episode later.
    """
    folder = metadata.get("data_dir") or os.environ.get(env_var)
    if not folder:
        raise FileNotFoundError(
            f"{env_name} needs data that is not part of this project and is never downloaded by it. "
            f"{how_to_get} Then point at it: export {env_var}=/path/to/it (or set 'data_dir' in the "
            f"task metadata)."
        )
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"{env_name} data folder {str(path)!r} (from {'metadata data_dir' if metadata.get('data_dir') else env_var}) "
            f"does not exist. {how_to_get}"
        )
    return path
