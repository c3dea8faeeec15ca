"""Which expert lengths an environment's tasks can have, so ``make_data`` refuses impossible ``--min-len`` /
``--max-len`` when it reads them instead of trying thousands of seeds and ending in a traceback.

Bounds are exact where the environment fixes them and generous otherwise (a wall layout's longest optimal
path is bounded by its free cells), so no length a task can have is refused.
"""

from __future__ import annotations

GRIDNAV_DEFAULTS = {"size": 5, "walls": 0.2}  # envs/gridnav.py's defaults
HANOI_DISKS = 3  # hanoi.py's default


def longest(env: str, params: dict) -> tuple[int, str, str] | None:
    """(the longest optimal expert path, the setting, the rule) for ``env`` with these task parameters; None
    where no bound is known."""
    if env == "gridnav":
        size = params.get("size") or GRIDNAV_DEFAULTS["size"]
        walls = GRIDNAV_DEFAULTS["walls"] if params.get("walls") is None else params["walls"]
        if not walls:
            return 2 * (size - 1), f"gridnav --size {size} --walls 0", "2 x (size - 1)"
        free = size * size - round(walls * size * size)
        return free - 1, f"gridnav --size {size} --walls {walls}", "its free cells - 1"
    if env == "hanoi":
        disks = params.get("disks") or HANOI_DISKS
        return 2 ** disks - 1, f"hanoi --disks {disks}", "2^disks - 1"
    return None


def _what_holds(env: str, params: dict, length: int) -> str:
    """The smallest change of setting whose tasks can have ``length`` moves."""
    if env == "gridnav":
        for size in range((params.get("size") or GRIDNAV_DEFAULTS["size"]) + 1, 21):
            if longest(env, {**params, "size": size})[0] >= length:
                return f"--size {size} or more holds {length}"
        return f"no grid up to --size 20 holds {length}"
    disks = 1
    while 2 ** disks - 1 < length:
        disks += 1
    return f"--disks {disks} or more holds {length}"


def length_flags_problem(env: str, params: dict, min_len: int, max_len: int | None) -> str | None:
    """Why ``--min-len`` / ``--max-len`` can keep no task of ``env``, in one line; None when they can."""
    if min_len < 1:
        return f"--min-len {min_len} must be >= 1 (an expert path has at least one move)"
    if max_len is not None and max_len < min_len:
        return f"--min-len {min_len} is above --max-len {max_len}: no task can be kept"
    bound = longest(env, params)
    if bound is not None and min_len > bound[0]:
        most, setting, rule = bound
        return (f"--min-len {min_len}: {setting} has optimal paths of at most {most} moves ({rule}), so no task "
                f"is kept; {_what_holds(env, params, min_len)}")
    return None
