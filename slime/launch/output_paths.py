"""The folders a run writes (``--save``, ``--metrics-dir``): checked before Ray, and never shared by two runs.

* They can be created (checked without creating them): otherwise the first write fails after Ray, the
  engines and the trainer are up, with a bare ``NotADirectoryError`` traceback. ``--dry-run`` creates
  nothing, so the check walks up to the nearest existing ancestor: it must be a writable folder.
* A run that does not ``--load`` a folder may not write into one that holds another run
  (``check_fresh_outputs``), and two runs may not write into one folder at once (``OutputLock``).
* Without either flag, each run gets a new folder under ``outputs/`` (``default_metrics_dir``).
"""

from __future__ import annotations

import os
from pathlib import Path

from slime.arguments.argument_error import ArgumentError
from slime.checkpoint.layout import holds_checkpoint

OUTPUT_FLAGS = (("save", "--save"), ("metrics_dir", "--metrics-dir"))


def creation_problem(path: Path) -> str | None:
    """Why the folder ``path`` cannot exist or be created, or None."""
    path = path.absolute()
    if path.exists():
        if not path.is_dir():
            return "it exists and is not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else "the folder is not writable"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None


def check_output_dirs(args) -> None:
    for name, flag in OUTPUT_FLAGS:
        value = getattr(args, name, None)
        if value:
            problem = creation_problem(Path(value))
            if problem:
                raise ArgumentError(f"{flag} {value}: cannot create that folder: {problem}")


def _same(a, b) -> bool:
    return bool(a and b) and Path(a).resolve() == Path(b).resolve()


def _resumes(folder, load) -> bool:
    """Whether ``--load`` is ``folder`` or one of its iterations."""
    return bool(folder and load) and (_same(folder, load) or Path(folder).resolve() in Path(load).resolve().parents)


def _holds_run(folder: Path) -> str | None:
    """What in ``folder`` belongs to an earlier run (a checkpoint, metrics rows), or None."""
    if not folder.is_dir():
        return None
    if holds_checkpoint(folder):
        return "a checkpoint"
    metrics = folder / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        return "metrics.jsonl rows"
    return None


def check_fresh_outputs(args) -> None:
    """A run that does not resume a folder (``--load`` it) must not write into one that holds another run:
    its steps would sit beside the old run's later ones in the same metrics.jsonl and checkpoints."""
    for name, flag in OUTPUT_FLAGS:
        value = getattr(args, name, None)
        if not value or _resumes(value, args.load) or (name == "metrics_dir" and _same(value, args.save)):
            continue
        if name == "metrics_dir" and args.load:
            continue  # a resume truncates its metrics file to the checkpoint's step (MetricsLogger)
        held = _holds_run(Path(value))
        if held:
            raise ArgumentError(f"{flag} {value} already holds a run ({held}): resume it with --load {value}, "
                                f"or choose a new {flag} folder")


def default_metrics_dir(args, root: str = "outputs") -> Path | None:
    """Without ``--save`` or ``--metrics-dir``, a new folder ``outputs/run-DATE-TIME[-N]`` for this run's
    metrics (set as ``args.metrics_dir``); None when the user named one."""
    if args.save or args.metrics_dir:
        return None
    import time

    stem = Path(root) / time.strftime("run-%Y%m%d-%H%M%S")
    for n in range(1000):
        folder = stem if n == 0 else Path(f"{stem}-{n}")
        try:
            folder.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        args.metrics_dir = str(folder)
        return folder
    raise ArgumentError(f"no new folder under {root}/ for this run's metrics: pass --metrics-dir")


def discard_unused(folder: Path | None) -> None:
    """Removes a folder ``default_metrics_dir`` made for a run that was then refused: it holds only the lock
    file, and an empty ``outputs/run-*`` per refused attempt would bury the runs that did happen."""
    if folder is None or any(entry.name != OutputLock.NAME for entry in folder.iterdir()):
        return
    (folder / OutputLock.NAME).unlink(missing_ok=True)
    folder.rmdir()


class OutputLock:
    """Held while a run writes its output folders: a second run into one of them is refused.

    ``flock`` on ``.slime-run.lock`` in each folder: the kernel releases it when the process ends however
    it ends, so a crashed run leaves no lock behind (the file stays, with the last holder's pid)."""

    NAME = ".slime-run.lock"

    def __init__(self, args):
        self._files = []
        self._made: list[Path] = []  # folders this lock created, outermost first (discard() removes them)
        seen = []
        for name, flag in OUTPUT_FLAGS:
            value = getattr(args, name, None)
            if not value or any(_same(value, other) for other in seen):
                continue
            seen.append(value)
            self._take(Path(value), flag)

    def _take(self, folder: Path, flag: str) -> None:
        import fcntl

        missing = [p for p in (folder.absolute(), *folder.absolute().parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        self._made.extend(reversed(missing))
        handle = open(folder / self.NAME, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            self.discard()
            raise ArgumentError(f"{flag} {folder} is in use by another run (pid {holder}): wait for it to end, "
                                f"or choose a new {flag} folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._files.append(handle)

    def release(self) -> None:
        for handle in self._files:
            handle.close()  # closing the file releases its flock
        self._files = []

    def discard(self) -> None:
        """Release, for a run refused before it wrote anything: its lock files go, and so do the folders
        the lock created (an empty --save holding a lock reads as a run that happened)."""
        names = [Path(handle.name) for handle in self._files]
        self.release()
        for lock_file in names:
            lock_file.unlink(missing_ok=True)
        for folder in reversed(self._made):  # innermost first
            try:
                folder.rmdir()
            except OSError:  # not empty: something else wrote there meanwhile
                break
        self._made = []
