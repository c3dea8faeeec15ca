"""Apply one of this repository's pull requests to an upstream THUDM/slime checkout.

    python tools/slime_pr/port.py [--pr tcod|tcod-core-only|adaptive-kl] SLIME_DIR [--dry-run] [--no-commit]

Each PR is a manifest module (``PRS``; TCOD by default): ``COPIED_FILES`` land at the same paths in SLIME_DIR (from
``SOURCES[path]`` here where that differs), ``edits(SLIME_DIR)`` gives the new text of the upstream files it edits,
``EXPECTED`` is what it relies on upstream, ``COMMITS`` its commit series (made when SLIME_DIR is a git work tree).
A changed CI template is re-rendered by upstream's generator. Nothing is written before everything is computed: a
tree lacking what the PR relies on is refused with one line naming it. A second run changes nothing.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr.manifest import GENERATOR, REPO, RENDERED, TEMPLATE  # noqa: E402
from tools.slime_pr.manifest import PortError as PortError  # noqa: E402 - raised by the manifests' edits too
from tools.slime_pr.trees import is_git_toplevel  # noqa: E402

# --pr -> its manifest module; tcod-core-only: the TCOD PR's other path, the getter alone (PR.md)
PRS = {"tcod": "manifest", "tcod-core-only": "manifest_tcod_core_only", "adaptive-kl": "manifest_adaptive_kl"}


def manifest_of(pr: str):
    return importlib.import_module(f"tools.slime_pr.{PRS[pr]}")


def check_tree(slime_dir: Path, pr) -> None:
    if not slime_dir.is_dir():
        raise PortError(f"{slime_dir} is not a directory")
    if slime_dir.resolve() == REPO:
        raise PortError("SLIME_DIR is this repository itself; point it at an upstream THUDM/slime checkout")
    for rel, needle, why in pr.EXPECTED:
        path = slime_dir / rel
        if not path.is_file():
            raise PortError(f"{slime_dir} is not upstream slime as of {pr.VERIFIED_COMMIT[:7]}: no {rel} ({why})")
        if needle not in path.read_text():
            raise PortError(f"{slime_dir}/{rel} lacks {needle!r} ({why}); written for {pr.VERIFIED_COMMIT[:7]}")


def sources(pr) -> dict[str, Path]:
    """{upstream path: the file of this repository it is copied from}."""
    return {rel: REPO / pr.SOURCES.get(rel, rel) for rel in pr.COPIED_FILES}


def planned_files(slime_dir: Path, pr) -> dict[str, bytes]:
    """Every file the PR adds or edits, with its new content (only those that differ)."""
    copied = sources(pr)
    absent = [str(src.relative_to(REPO)) for src in copied.values() if not src.is_file()]
    if absent:
        raise PortError(f"this repository lacks PR file(s) that {pr.__name__} lists: {', '.join(absent)}")
    new = {rel: src.read_bytes() for rel, src in copied.items()}
    new.update({rel: text.encode() for rel, text in pr.edits(slime_dir).items()})
    return {rel: data for rel, data in new.items() if not (slime_dir / rel).is_file()
            or (slime_dir / rel).read_bytes() != data}


def write_changes(slime_dir: Path, changes: dict[str, bytes]) -> None:
    """Write the planned files; a changed CI template is re-rendered (``changes`` then names the rendered file)."""
    for rel, data in changes.items():
        (slime_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (slime_dir / rel).write_bytes(data)
    if TEMPLATE in changes and (slime_dir / GENERATOR).is_file():
        subprocess.run([sys.executable, str(slime_dir / GENERATOR)], check=True, capture_output=True, text=True)
        changes[RENDERED] = b""


def _commit(slime_dir: Path, changed: list[str], pr) -> list[str]:
    made, left = [], set(changed)
    git = ["git", "-C", str(slime_dir)]
    for message, paths in pr.COMMITS:
        part = [p for p in paths if p in left]
        if not part:
            continue
        left -= set(part)
        subprocess.run([*git, "add", "--", *part], check=True)
        ident = ["-c", f"user.name={pr.AUTHOR}", "-c", f"user.email={pr.AUTHOR}@localhost"]
        subprocess.run([*git, *ident, "commit", "-q", "-m", message, "--", *part], check=True)
        made.append(message)
    if left:
        raise PortError(f"files outside the commit series: {sorted(left)}")
    return made


def port(slime_dir: Path, dry_run: bool = False, commit: bool = True, pr: str = "tcod") -> list[str]:
    """Apply the PR to SLIME_DIR; one line per file added or edited and per commit made."""
    manifest, slime_dir = manifest_of(pr), slime_dir.resolve()
    check_tree(slime_dir, manifest)
    changes = planned_files(slime_dir, manifest)
    lines = [f"{'edit' if (slime_dir / rel).exists() else 'add':5s}{rel}" for rel in sorted(changes)]
    if dry_run or not changes:
        return lines
    write_changes(slime_dir, changes)
    if commit and is_git_toplevel(slime_dir):
        lines += [f"commit {m}" for m in _commit(slime_dir, list(changes), manifest)]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slime_dir", type=Path, help="an upstream THUDM/slime checkout (changed in place)")
    parser.add_argument("--dry-run", action="store_true", help="list the changes without making them")
    parser.add_argument("--no-commit", action="store_true", help="write the files but do not commit them")
    parser.add_argument("--pr", choices=tuple(PRS), default="tcod", help="which pull request (default: tcod)")
    args = parser.parse_args(argv)
    try:
        lines = port(args.slime_dir, dry_run=args.dry_run, commit=not args.no_commit, pr=args.pr)
    except PortError as err:
        print(f"port.py: refusing: {err}", file=sys.stderr)
        return 2
    if not lines:
        print(f"port.py: {args.slime_dir} already holds this PR; nothing to do")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
