"""The environment train_cpu.py runs slime's train.py in: a cached Python 3.11 venv of what slime imports (even in the
modes the harness never uses), and Megatron-LM with slime's patch applied to a copy the harness owns.

    python tools/slime_pr/train_cpu_env.py SLIME_DIR      # build (or find) both; print the venv and the Megatron copy

Everything lives under ``$TRAIN_CPU_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/slime-tcod/train-cpu``); a folder's
name hashes what it was built from, ``TRAIN_CPU_REBUILD=1`` rebuilds. The runtime's own ``.venv`` is never touched.

Why these versions: slime's image runs SGLang 0.5.15.post1 (docker/Dockerfile's tag), which pins transformers 5.12.1;
slime asserts numpy 1.x. SGLang is installed ``--no-deps`` (nothing of it serves here: it only has to import, because
slime's argument parser reads ``ServerArgs``); its import chain reaches ``torchvision.io`` and ``triton``. A CPU torch
cannot load PyPI's torchvision (CUDA-built ops), so the venv holds PyPI's torch 2.14.1 with its matching torchvision
0.29.1: the CUDA build, which runs on CPU. Megatron-LM is ``MEGATRON_LM_DIR`` (slime's image pins commit 1dcf0da);
``docker/patch/latest/megatron.patch`` from SLIME_DIR is applied to the harness's copy, or found applied already; a
patch that applies neither way fails here, by name.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.slime_pr.trees import say  # noqa: E402

PYTHON_VERSION = "3.11"
MEGATRON_PATCH = "docker/patch/latest/megatron.patch"
MARKER = ".slime-tcod-complete"
PIP_NOISE = ("is ignored: it is neither a file nor a directory", "[notice]", "DEPRECATION:", "requires", "incompatible")
# One pip call per line, in order. The last line: SGLang without its dependency tree (flashinfer, CUDA kernels...), and torch_memory_saver
# (slime's actor imports it; its hooks are never preloaded since the harness never offloads).
PIP_LINES: tuple[tuple[str, ...], ...] = (
    ("torch==2.14.1", "torchvision==0.29.1"),
    ("numpy<2", "transformers==5.12.1", "ray==2.60.0", "safetensors", "pyyaml", "einops", "packaging",
     # slime's own imports (requirements.txt) that train.py reaches
     "wandb", "pylatexenc", "openai", "sglang-router", "aiohttp", "httpx", "requests", "tensorboard",
     # what `import sglang.srt.server_args` reaches once installed --no-deps
     "triton", "pillow", "ipython", "pyzmq", "dill", "partial_json_parser", "sentencepiece", "six", "fastapi",
     "uvicorn", "psutil", "pybase64", "orjson", "msgspec", "pydantic"),
    ("--no-deps", "sglang==0.5.15.post1", "torch_memory_saver==0.0.10"),
    # what SGLang's server imports beyond that, so the harness's engines and teacher are real SGLang servers (pins:
    # SGLang 0.5.15.post1's own requirements where it pins)
    ("jsonschema", "soundfile==0.13.1", "xgrammar==0.2.1", "apache-tvm-ffi==0.1.11", "openai-harmony==0.0.4",
     "compressed-tensors", "gguf", "scipy", "tiktoken", "setproctitle", "uvloop", "python-multipart", "watchfiles",
     "zstandard", "distro", "prometheus-client>=0.20.0", "interegular", "blobfile==3.0.0"),
)


class EnvError(RuntimeError):
    pass


def cache_root() -> Path:
    if os.environ.get("TRAIN_CPU_CACHE"):
        return Path(os.environ["TRAIN_CPU_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slime-tcod" / "train-cpu"


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:12]


def find_python() -> str:
    if sys.version_info[:2] == tuple(map(int, PYTHON_VERSION.split("."))):
        return sys.executable
    for cand in (shutil.which(f"python{PYTHON_VERSION}"),
                 *sorted((Path.home() / ".pyenv/versions").glob(f"{PYTHON_VERSION}.*/bin/python"), reverse=True)):
        if cand and subprocess.run([str(cand), "-c", "import sys; assert sys.version_info[:2] == (3, 11)"],
                                   capture_output=True).returncode == 0:
            return str(cand)
    raise EnvError(f"no Python {PYTHON_VERSION} found (the torch wheels here are cp311); put python3.11 on PATH")


def _pip(python: Path, words, log) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *words]
    say(f"  $ pip install {' '.join(words)}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        text = [ln for ln in (proc.stdout + proc.stderr).splitlines() if not any(n in ln for n in PIP_NOISE)]
        raise EnvError(f"pip install {' '.join(words)} failed (exit {proc.returncode}):\n" + "\n".join(text[-20:]))
    say(f"    {time.monotonic() - t0:.0f}s")


def build_venv() -> Path:
    """The venv, built unless a complete one with the same pip lines is cached."""
    py = find_python()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"py{PYTHON_VERSION}-{_key(PIP_LINES)}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs building the same cache: the second waits, then finds it
        if (venv / MARKER).is_file() and os.environ.get("TRAIN_CPU_REBUILD") != "1":
            return venv
        if os.environ.get("VERIFY_NO_INSTALL") == "1":
            raise EnvError(f"{venv} is not built and VERIFY_NO_INSTALL=1 forbids installing")
        shutil.rmtree(venv, ignore_errors=True)
        say(f"train_cpu venv: building {venv} (a few minutes, once)")
        subprocess.run([py, "-m", "venv", str(venv)], check=True)
        with open(venv / "pip-install.log", "w") as log:
            for words in PIP_LINES:
                _pip(venv / "bin/python", words, log)
        freeze = subprocess.run([str(venv / "bin/python"), "-m", "pip", "list", "--format=freeze"],
                                capture_output=True, text=True).stdout
        (venv / MARKER).write_text(json.dumps([list(w) for w in PIP_LINES]) + "\n" + freeze)
    return venv


def _megatron_commit(src: Path) -> str:
    out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def _git_apply(cwd: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess:
    # Run outside any repository (GIT_DIR points nowhere), so git apply patches the files as plain `patch` would.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(cwd.parent))
    return subprocess.run(["git", "apply", *flags, str(patch)], cwd=cwd, capture_output=True, text=True, env=env)


def megatron_copy(megatron_dir: Path, slime_dir: Path) -> Path:
    """A copy of MEGATRON_LM_DIR with SLIME_DIR's megatron.patch applied (MEGATRON_LM_DIR itself is only read)."""
    if not (megatron_dir / "megatron/training/arguments.py").is_file():
        raise EnvError(f"MEGATRON_LM_DIR={megatron_dir} is not a Megatron-LM tree (no megatron/training/arguments.py); "
                       "make one with `git archive 1dcf0da` of NVIDIA/Megatron-LM")
    patch = slime_dir / MEGATRON_PATCH
    if not patch.is_file():
        raise EnvError(f"{patch} not found: SLIME_DIR has no Megatron patch where slime keeps it")
    patch_sha = hashlib.sha256(patch.read_bytes()).hexdigest()[:12]
    stamp = (megatron_dir / "megatron/core/package_info.py").read_text() + _megatron_commit(megatron_dir)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"megatron-{_key(str(megatron_dir.resolve()), stamp, patch_sha)}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / MARKER).is_file() and os.environ.get("TRAIN_CPU_REBUILD") != "1":
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(megatron_dir, dest, ignore=shutil.ignore_patterns(".git", "__pycache__"), symlinks=True)
        if _git_apply(dest, patch, "--check").returncode == 0:
            proc = _git_apply(dest, patch)
            if proc.returncode != 0:
                raise EnvError(f"{MEGATRON_PATCH} passed --check but failed to apply: {proc.stderr[-600:]}")
            how = "applied"
        elif _git_apply(dest, patch, "--check", "--reverse").returncode == 0:
            how = "already applied in MEGATRON_LM_DIR"
        else:
            err = _git_apply(dest, patch, "--check").stderr
            raise EnvError(f"slime's {MEGATRON_PATCH} applies to MEGATRON_LM_DIR={megatron_dir} neither forward nor "
                           f"reversed (a Megatron-LM other than the commit slime pins, 1dcf0da?): {err[-600:]}")
        (dest / MARKER).write_text(f"{how}: {patch} ({patch_sha}) onto {megatron_dir}\n")
        say(f"train_cpu Megatron-LM: {dest} (megatron.patch {how})")
    return dest


def megatron_dir_from_env() -> Path:
    value = os.environ.get("MEGATRON_LM_DIR")
    if not value:
        raise EnvError("MEGATRON_LM_DIR is not set: point it at Megatron-LM at slime's pinned commit 1dcf0da "
                       "(e.g. `git -C MEGATRON_GIT archive 1dcf0da | tar -x -C DIR`)")
    return Path(value)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slime_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        venv = build_venv()
        meg = megatron_copy(megatron_dir_from_env(), args.slime_dir)
    except EnvError as exc:
        say(f"train_cpu_env: ERROR: {exc}")
        return 2
    say(f"venv: {venv}\nmegatron: {meg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
