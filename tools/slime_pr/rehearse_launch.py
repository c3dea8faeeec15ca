"""CPU rehearsal of the TCOD PR's launch script, ``examples/multi_turn_tcod/run-qwen3-8B-tcod.sh``, in this runtime.

    python tools/slime_pr/rehearse_launch.py [--mode b2f|f2b] [--dir DIR]

The script runs with launch_capture.py's recording stand-ins for ``python3``, ``ray`` and ``curl``, which yields the
``train.py`` flags it submits; those run for 2 rollouts through this repository's ``train.py --train-backend
megatron`` with ``scripts/rehearsal.py``'s swaps (tiny models, the hf_engine for SGLang, a few gridnav tasks, small
sizes). Upstream's ``scripts/models/qwen3-8B.sh`` is not here (an empty ``MODEL_ARGS`` stands in; the tiny model's
config.json describes it); flags this runtime does not implement are dropped and listed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import launch_capture  # noqa: E402

from scripts.rehearsal import rehearse, split_flags  # noqa: E402


def captured_argv(mode: str, work: Path) -> list[str]:
    """The ``train.py`` flags the launch script submits for ``TCOD_MODE=mode``."""
    tree = work / "tree"
    shutil.copytree(ROOT / "examples" / "multi_turn_tcod", tree / "examples" / "multi_turn_tcod")
    (tree / "scripts" / "models").mkdir(parents=True)
    (tree / "scripts" / "models" / "qwen3-8B.sh").write_text("MODEL_ARGS=()\n")
    launch_capture.SCRIPT_RUNS[:] = [{"TCOD_MODE": mode}]
    (launch,) = launch_capture.script_launches(tree, work)
    if launch.problems:
        raise SystemExit(f"rehearse_launch: capturing the launch failed: {'; '.join(launch.problems)}")
    return launch.argv


def unknown_flags(argv: list[str]) -> set[str]:
    from slime.utils.arguments import get_parser

    known = {opt for action in get_parser()._actions for opt in action.option_strings}
    return {group[0] for group in split_flags(argv) if group[0] not in known}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("b2f", "f2b"), default="b2f", help="the script's TCOD_MODE")
    parser.add_argument("--dir", default=None, help="where outputs go (default: a new temporary folder)")
    ns = parser.parse_args(argv)
    work = Path(ns.dir) if ns.dir else Path(tempfile.mkdtemp(prefix="slime-rehearsal-"))
    work.mkdir(parents=True, exist_ok=True)
    flags = captured_argv(ns.mode, work)
    drop = unknown_flags(flags)
    print(f"rehearse_launch: upstream-only flags dropped: {' '.join(sorted(drop)) or 'none'}")
    return rehearse(flags, "gridnav", work, extra_replace={"--train-backend": ["megatron"]}, drop=drop)


if __name__ == "__main__":
    sys.exit(main())
