"""Checkpoint file integrity: a sha256 manifest per checkpoint, and readers that name the file they fail on.

``write_manifest(folder)`` hashes every file below ``folder`` into ``checksums.json`` (written last, just
before the driver renames the folder into place). ``verify_manifest(folder)`` recomputes the hashes and
raises :class:`CheckpointError` naming the first missing, resized or changed file, so a truncated or
bit-flipped file is found before anything is loaded (a flipped weight otherwise loads silently).
Folders written before manifests existed have none: ``verify_manifest`` returns False and the caller
decides (the driver loads them with a warning).

``read_json`` / ``read_safetensors`` turn a bare ``JSONDecodeError`` or ``SafetensorError`` into an
error that names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = "checksums.json"
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt or unreadable; the message names it."""


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)  # releases the GIL for large buffers: files hash in parallel threads
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file below ``folder`` (relative paths), except the manifest itself."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST)


def _hash_all(folder: Path, names: list[str]) -> list[str]:
    workers = max(1, min(8, os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda name: file_sha256(folder / name), names))


def write_manifest(folder) -> Path:
    """Record size and sha256 of every file below ``folder`` in ``folder/checksums.json``."""
    folder = Path(folder)
    names = _files(folder)
    hashes = _hash_all(folder, names)
    manifest = {"algorithm": "sha256",
                "files": {n: {"size": (folder / n).stat().st_size, "sha256": h} for n, h in zip(names, hashes)}}
    path = folder / MANIFEST
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def verify_manifest(folder) -> bool:
    """True if every file of the manifest is present and unchanged; False if there is no manifest.

    Raises :class:`CheckpointError` naming the first bad file. Sizes are compared before hashing, so a
    truncated file is reported without reading the rest.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.exists():
        return False
    files = read_json(path).get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: no 'files' table")
    for name, entry in files.items():
        target = folder / name
        if not target.is_file():
            raise CheckpointError(f"{target}: listed in {MANIFEST} but missing")
        size = target.stat().st_size
        if size != entry.get("size"):
            raise CheckpointError(f"{target}: {size} bytes, {MANIFEST} recorded {entry.get('size')} (truncated or "
                                  "overwritten)")
    names = sorted(files)
    for name, digest in zip(names, _hash_all(folder, names)):
        if digest != files[name].get("sha256"):
            raise CheckpointError(f"{folder / name}: sha256 differs from {MANIFEST} (the file is corrupt)")
    return True


def read_json(path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err}); the file is truncated or corrupt") from None


def read_safetensors(path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: unreadable safetensors file ({err}); the file is truncated or corrupt") \
            from None
