"""Port the multi-turn TCOD contribution onto an upstream THUDM/slime tree.

    python tools/slime_pr/port.py SLIME_DIR [--dry-run]

What it does (checked against upstream commit ``VERIFIED_COMMIT``):

* copies the contribution's files (``CONTRIBUTION_FILES`` and the ``examples/multi_turn_tcod`` folder)
  into SLIME_DIR. ``slime/rollout/on_policy_distillation.py`` replaces upstream's file of that name:
  same payload and post-processing contract, plus ``list[Sample]``, bounded retries and task rewards;
* edits upstream's ``slime/utils/arguments.py`` in three marked places: one import, the
  ``--max-turns`` / ``--max-turn-response-len`` / ``--rollout-interaction-env-path`` / ``--tcod-*``
  groups registered right after the on-policy-distillation group, and
  ``validate_multi_turn_tcod_args(args)`` at the end of ``slime_validate_args`` (after the
  ``--custom-config-path`` YAML is applied, so values set there are validated too).

It refuses, and changes nothing, when SLIME_DIR does not look like the expected upstream tree. Running
it again changes nothing: files are written only when their bytes differ, and each edit is skipped
when its marker is already there. Nothing of upstream is copied into this project; this script only
edits the checkout it is pointed at.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERIFIED_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
MARK = "multi_turn_tcod (tools/slime_pr/port.py)"

# The slime contribution: these files run unchanged in upstream slime and in this project's runtime.
CONTRIBUTION_FILES = (
    "slime/rollout/tcod.py",
    "examples/multi_turn_tcod/rollout.py",
    "examples/multi_turn_tcod/teacher_prefix.py",
    "examples/multi_turn_tcod/env_adapter.py",
    "examples/multi_turn_tcod/chat_layout.py",
    "slime/rollout/expert_sft.py",
    "slime/rollout/on_policy_distillation.py",
    "slime/utils/tcod_arguments.py",
)
CONTRIBUTION_DIRS = ("examples/multi_turn_tcod",)
# Files of the example folder that drive this project's runtime (train.py, metrics.jsonl) and would
# not run on upstream's trainer; they are left out of the port.
RUNTIME_ONLY = (
    "examples/multi_turn_tcod/run-tiny-tcod.sh",
    "examples/multi_turn_tcod/run-qwen3-8B-tcod.sh",
    "examples/multi_turn_tcod/report.py",
)
SKIP_NAMES = {"__pycache__", ".pytest_cache"}

# What the port relies on in upstream's tree: (file, text that must be there, why).
EXPECTED = (
    ("slime/utils/arguments.py", "def get_slime_extra_args_provider(", "the argument groups"),
    ("slime/utils/arguments.py", "        parser = add_on_policy_distillation_arguments(parser)\n",
     "where the TCOD groups are registered"),
    ("slime/utils/arguments.py", "def slime_validate_args(args):", "where the TCOD flags are validated"),
    ("slime/rollout/sglang_rollout.py", "def generate_rollout(", "the rollout function TCOD wraps"),
    ("slime/rollout/sglang_rollout.py", "if sample.reward is None:", "the reward model runs only for reward None"),
    ("slime/utils/types.py", "class Status(Enum):", "Sample.Status"),
    ("slime/utils/types.py", "remove_sample: bool = False", "upstream's way to drop samples"),
    ("slime/utils/http_utils.py", "async def post(url, payload, max_retries=60, headers=None):", "http_utils.post"),
    ("slime/utils/misc.py", "def load_function(", "plugin loading"),
)
# Flags the port adds; upstream must not define them already.
ADDED_FLAGS = ("--max-turns", "--max-turn-response-len", "--rollout-interaction-env-path", "--use-tcod",
               "--tcod-mode", "--tcod-eta", "--tcod-k-start", "--tcod-k-max", "--tcod-prefix-source")

IMPORT_LINE = "from slime.utils.tcod_arguments import add_multi_turn_tcod_arguments, validate_multi_turn_tcod_args"
REGISTER_LINE = f"        parser = add_multi_turn_tcod_arguments(parser)  # {MARK}\n"
VALIDATE_LINE = f"    validate_multi_turn_tcod_args(args)  # {MARK}\n"


class PortError(RuntimeError):
    """SLIME_DIR is not the upstream tree this port was written for."""


# ---------------------------------------------------------------------------- checks
def check_tree(slime_dir: Path) -> None:
    if not slime_dir.is_dir():
        raise PortError(f"{slime_dir} is not a directory")
    problems = []
    for rel, needle, why in EXPECTED:
        path = slime_dir / rel
        if not path.is_file():
            missing = f"{rel} is missing"
            if not any(p.startswith(missing) for p in problems):
                problems.append(f"{missing} ({why})")
        elif needle not in path.read_text():
            problems.append(f"{rel} lacks {needle.strip()!r} ({why})")
    if not problems:
        arguments = (slime_dir / "slime/utils/arguments.py").read_text()
        for flag in ADDED_FLAGS:
            if f'"{flag}"' in arguments and MARK not in arguments:
                problems.append(f"upstream already defines {flag}; this port would register it twice")
    if problems:
        raise PortError(f"{slime_dir} does not look like upstream THUDM/slime as of {VERIFIED_COMMIT[:7]}:\n  - "
                        + "\n  - ".join(problems))


# ---------------------------------------------------------------------------- file copies
def contribution_files() -> list[str]:
    files = list(CONTRIBUTION_FILES)
    for folder in CONTRIBUTION_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            rel = path.relative_to(REPO).as_posix()
            if path.is_file() and rel not in RUNTIME_ONLY and not SKIP_NAMES & set(path.parts):
                files.append(rel)
    return files


def copy_file(rel: str, slime_dir: Path, dry_run: bool) -> str | None:
    source, target = REPO / rel, slime_dir / rel
    data = source.read_bytes()
    if target.is_file() and target.read_bytes() == data:
        return None
    action = "replace" if target.exists() else "add"
    if not dry_run:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return f"{action:8s}{rel}"


# ---------------------------------------------------------------------------- arguments.py
def _end_of_function(source: str, name: str) -> int:
    """Index (in ``source``) just after the last line of top-level function ``name``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            if any(isinstance(n, ast.Return) for n in ast.walk(node)):
                raise PortError(f"{name} has a return statement: a call appended at its end might not run")
            lines = source.splitlines(keepends=True)
            return sum(len(line) for line in lines[: node.end_lineno])
    raise PortError(f"slime/utils/arguments.py has no top-level {name}()")


def _end_of_imports(source: str) -> int:
    """Index just after the last top-level import that precedes the first definition."""
    last = None
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last = node
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            break
    if last is None:
        raise PortError("slime/utils/arguments.py has no imports to add ours after")
    lines = source.splitlines(keepends=True)
    return sum(len(line) for line in lines[: last.end_lineno])


def edit_arguments(source: str) -> tuple[str, list[str]]:
    """The edited arguments.py and a line per edit made (none when already ported)."""
    done = []
    if IMPORT_LINE not in source:
        anchor = _end_of_imports(source)
        source = source[:anchor] + f"{IMPORT_LINE}  # {MARK}\n" + source[anchor:]
        done.append("import the multi-turn TCOD argument module")
    if REGISTER_LINE not in source:
        anchor = "        parser = add_on_policy_distillation_arguments(parser)\n"
        source = source.replace(anchor, anchor + REGISTER_LINE, 1)
        done.append("register --max-turns, --max-turn-response-len, --rollout-interaction-env-path, --tcod-*")
    if VALIDATE_LINE not in source:
        end = _end_of_function(source, "slime_validate_args")
        source = source[:end] + VALIDATE_LINE + source[end:]
        done.append("validate them at the end of slime_validate_args")
    ast.parse(source)  # never leave a file behind that does not parse
    return source, done


# ---------------------------------------------------------------------------- main
def port(slime_dir: Path, dry_run: bool = False) -> list[str]:
    slime_dir = slime_dir.resolve()
    if slime_dir == REPO:
        raise PortError("SLIME_DIR is this project itself; point it at an upstream THUDM/slime checkout")
    check_tree(slime_dir)
    changes = [line for rel in contribution_files() if (line := copy_file(rel, slime_dir, dry_run))]
    arguments = slime_dir / "slime/utils/arguments.py"
    edited, edits = edit_arguments(arguments.read_text())
    if edits and not dry_run:
        arguments.write_text(edited)
    changes += [f"edit    slime/utils/arguments.py: {what}" for what in edits]
    return changes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slime_dir", type=Path, help="an upstream THUDM/slime checkout (it is modified in place)")
    parser.add_argument("--dry-run", action="store_true", help="list the changes without making them")
    args = parser.parse_args(argv)
    try:
        changes = port(args.slime_dir, dry_run=args.dry_run)
    except PortError as err:
        print(f"port.py: refusing: {err}", file=sys.stderr)
        return 2
    verb = "would change" if args.dry_run else "changed"
    if not changes:
        print(f"port.py: {args.slime_dir} already holds this contribution; nothing to do")
    else:
        print(f"port.py: {verb} {len(changes)} file(s) in {args.slime_dir}:")
        for line in changes:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
