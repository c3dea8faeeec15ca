"""Where the driver's checkpoints are, and which one ``--load`` resumes.

A save root holds one folder per saved step, ``iter_{rollout_id:07d}/``, and
``latest_checkpointed_iteration.txt`` (the Megatron/slime convention) naming the newest complete one.
``slime.checkpoint.driver`` writes them; this module only reads the layout, so the resume checks and the
``--dry-run`` plan import it without torch.

``--load ROOT`` verifies the checksums of the newest iteration and, if a file is corrupt, warns naming
it and falls back to the newest intact older iteration (an error if none is intact). ``--load
ROOT/iter_X`` asks for that iteration only: a corrupt file there is an error. Iterations written before
checksums existed load with a warning. A missing or empty ``--load`` folder holds nothing to resume
(:func:`holds_checkpoint`): upstream's ``--load $SAVE --save $SAVE`` then starts from step 0.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from slime.checkpoint.files import CheckpointError, verify_manifest

LATEST = "latest_checkpointed_iteration.txt"
_ITER = re.compile(r"iter_(\d{7})$")
logger = logging.getLogger(__name__)


def iteration_dir(root, rollout_id: int) -> Path:
    return Path(root) / f"iter_{rollout_id:07d}"


def _candidates(root: Path) -> list[Path]:
    """Iteration folders of a save root, newest first; the one ``LATEST`` names leads."""
    found = sorted((p for p in root.iterdir() if p.is_dir() and _ITER.match(p.name)), reverse=True)
    latest = root / LATEST
    if latest.exists():
        named = iteration_dir(root, int(latest.read_text().strip()))
        found = [named] + [p for p in found if p != named]
    return found


def holds_checkpoint(load) -> bool:
    """Whether ``--load`` names something to resume; False for a missing or empty folder (a first run).

    A missing ``iter_*`` folder asked for by name, a file, or a root whose iterations are all broken
    count as checkpoints, so :func:`find_checkpoint` reports them instead of the run starting over.
    """
    path = Path(load)
    if not path.exists():
        return bool(_ITER.match(path.name))
    if not path.is_dir() or (path / "trainer_state.json").exists() or (path / LATEST).exists():
        return True
    return bool(_candidates(path))


def _verified(folder: Path) -> Path:
    """``folder`` if its checksums match; a checkpoint without a manifest passes with a warning."""
    if not (folder / "trainer_state.json").exists():
        raise CheckpointError(f"{folder}: incomplete or missing (no trainer_state.json)")
    if not verify_manifest(folder):
        logger.warning("%s has no checksums (written before they were recorded): loading it unverified", folder)
    return folder


def find_checkpoint(load, verify: bool = True) -> Path:
    """The checkpoint folder ``--load`` points at: an ``iter_*`` folder, or the newest intact one of a root.

    With ``verify`` every file is checked against the checkpoint's checksums (see the module docstring for
    the fall-back). Raises :class:`CheckpointError` (a ``RuntimeError``) naming the bad file.
    """
    path = Path(load)
    check = _verified if verify else (lambda folder: folder)
    if (path / "trainer_state.json").exists():
        try:
            return check(path)
        except CheckpointError as err:
            raise CheckpointError(f"--load {load}: {err}. Pass the save root instead of one iteration to fall "
                                  "back to the newest intact iteration") from None
    if not path.is_dir() or not (_candidates(path) or (path / LATEST).exists()):
        raise CheckpointError(f"--load {load}: neither a checkpoint folder (trainer_state.json) nor a "
                              f"save root with {LATEST} or iter_* folders")
    problems = []
    for folder in _candidates(path):
        try:
            found = check(folder)
        except CheckpointError as err:
            problems.append(str(err))
            logger.warning("--load %s: skipping %s: %s", load, folder.name, err)
            continue
        if problems:
            logger.warning("--load %s: falling back to %s, the newest intact iteration", load, found.name)
        return found
    raise CheckpointError(f"--load {load}: no intact checkpoint: " + "; ".join(problems))
