"""The upstream trees the harness works on: copied, checksummed, the environment their tests run in (the tree
first on ``sys.path``, no stray ``SLIME_CONTRACT_*``), and imported into this process with stubs.

    python tools/slime_pr/trees.py copy SRC DST   # a git checkout: its tracked and untracked-but-not-ignored
                                                  # files; a plain tree: all but VCS, cache and venv folders
    python tools/slime_pr/trees.py digest DIR     # one sha256 over paths, modes and contents (.git, caches,
                                                  # venvs, *.egg-info, *.pyc left out): port.py's idempotence

The stubs stand for packages upstream imports but CPU checks never use (ray, sglang, megatron, ...), as upstream's own
CPU contract tests stub them: every attribute a do-nothing class, its instantiations recorded in ``StubModule.used``.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import os
import shutil
import stat
import subprocess
import sys
import types
from pathlib import Path

ENV_PREFIX = "SLIME_CONTRACT_"
EXCLUDED_DIRS = {".git", "__pycache__", ".pytest_cache", ".venv", "venv", ".mypy_cache", ".ruff_cache"}


def _skip_dir(name: str) -> bool:
    """Folders left out of plain-tree copies and of checksums: VCS, caches, virtualenvs, build metadata."""
    return name in EXCLUDED_DIRS or name.endswith(".egg-info")


def say(msg: str = "") -> None:
    print(msg, flush=True)


def tail(text: str, n: int) -> str:
    return "\n".join("    " + line for line in text.splitlines()[-n:])


def is_git_toplevel(path: Path) -> bool:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return out.returncode == 0 and Path(out.stdout.strip()).resolve() == path.resolve()


def _tree_files(root: Path) -> list[str]:
    """Relative paths of the files that make up the tree."""
    if is_git_toplevel(root):
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                             capture_output=True, check=True).stdout
        names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
        return [n for n in names if os.path.lexists(root / n)]  # tracked files deleted in the work tree
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))
        rel = os.path.relpath(dirpath, root)
        for f in sorted(filenames):
            if not f.endswith(".pyc"):
                names.append(os.path.normpath(os.path.join(rel, f)))
    return names


def copy_tree(src: Path, dst: Path) -> int:
    """Copy the files that make up ``src`` into ``dst``; returns how many entries were copied."""
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for rel in _tree_files(src):
        s, d = src / rel, dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_symlink():
            os.symlink(os.readlink(s), d)
        elif s.is_dir():  # a submodule: copy its files
            shutil.copytree(s, d, symlinks=True, ignore=shutil.ignore_patterns(*EXCLUDED_DIRS))
        else:
            shutil.copy2(s, d)
        n += 1
    return n


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))
        for f in sorted(filenames):
            if f.endswith(".pyc"):
                continue
            p = Path(dirpath, f)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
            if stat.S_ISLNK(st.st_mode):
                h.update(b"L" + os.readlink(p).encode() + b"\0")
            else:
                h.update(b"X" if st.st_mode & stat.S_IXUSR else b"F")
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def tree_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for running a tree's tests: the tree first on sys.path, no stray contract vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = str(tree)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------------- stubs
class StubModule(types.ModuleType):
    used: list[str] = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def init(obj, *args, **kwargs):
            StubModule.used.append(qualified)

        stub = type(name, (), {"__init__": init})
        setattr(self, name, stub)
        return stub


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import under ``packages`` with a :class:`StubModule`."""

    def __init__(self, packages):
        self.packages = tuple(packages)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(packages) -> StubFinder:
    finder = StubFinder(packages)
    sys.meta_path.insert(0, finder)
    return finder


# megatron.core.mpu as one process sees it alone: one data-, tensor- and context-parallel rank, the last (only)
# pipeline stage, no process group.
ONE_RANK = {"is_pipeline_last_stage": True, "get_context_parallel_world_size": 1, "get_context_parallel_rank": 0,
            "get_tensor_model_parallel_rank": 0, "get_data_parallel_rank": 0, "get_data_parallel_world_size": 1,
            "get_data_parallel_group": None}


def install_one_rank_mpu() -> None:
    """Stub megatron (if it is not already) and give it a ``megatron.core.mpu`` that answers ``ONE_RANK``."""
    if not any(isinstance(f, StubFinder) and "megatron" in f.packages for f in sys.meta_path):
        install(("megatron",))
    import megatron.core

    mpu = StubModule("megatron.core.mpu")
    for name, value in ONE_RANK.items():
        setattr(mpu, name, lambda *args, _value=value, **kwargs: _value)
    sys.modules["megatron.core.mpu"] = megatron.core.mpu = mpu


def main(argv=None) -> int:
    cmd, *paths = sys.argv[1:] if argv is None else argv
    if cmd == "copy" and len(paths) == 2:
        say(f"copied {copy_tree(Path(paths[0]).resolve(), Path(paths[1]))} entries of {paths[0]} to {paths[1]}")
    elif cmd == "digest" and len(paths) == 1:
        print(tree_digest(Path(paths[0])))
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
