"""A cached Python environment that runs real SGLang servers for ``--rollout-backend sglang --sglang-python PATH``.

    python -m slime.backends.sglang_utils.sglang_env          # build it once (minutes), print its python
    python -m slime.backends.sglang_utils.sglang_env --check  # print its python if built, exit 1 if not

SGLang pins its own torch and transformers (0.5.15.post1, slime's image pin: transformers 5.12.1, numpy 1.x), which
are not this runtime's, so SGLang never goes into the runtime's venv and the runtime never imports it: it runs
``PYTHON -m sglang.launch_server`` in a subprocess. This module only uses the standard library and never imports
sglang itself.

The environment lives in ``$SLIME_SGLANG_ENV_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/slime-tcod/sglang-env``),
in a folder whose name hashes the install lines below; it counts as built once its marker file exists, so an
interrupted build is redone, never used half-made. ``make test`` builds it when missing.

Why these lines (REFERENCE.md §14, and what the train_cpu harness installs for the same server): PyPI's torch 2.14.1
with its torchvision (the CUDA build; it runs on a CPU, and SGLang's import chain reaches ``torchvision.io``);
SGLang itself ``--no-deps``, since its full dependency tree is CUDA kernels that neither install nor run here; then
what its HTTP server imports. The train_cpu harness (tools/slime_pr/train_cpu_env.py) keeps a longer list of its
own for slime's train.py; the two overlap on purpose and are kept apart, since each is built for its own job.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PYTHON_VERSION = (3, 11)  # the torch 2.14.1 wheels used here are cp311
SGLANG_VERSION = "0.5.15.post1"
MARKER = ".slime-sglang-env-complete"
# One pip call per line, in order.
PIP_LINES: tuple[tuple[str, ...], ...] = (
    ("torch==2.14.1", "torchvision==0.29.1"),
    ("numpy<2", "transformers==5.12.1", "safetensors", "pyyaml", "einops", "packaging", "aiohttp", "requests",
     "openai", "httpx", "triton", "pillow", "ipython", "pyzmq", "dill", "partial_json_parser", "sentencepiece",
     "six", "fastapi", "uvicorn", "psutil", "pybase64", "orjson", "msgspec", "pydantic"),
    ("--no-deps", f"sglang=={SGLANG_VERSION}"),
    ("jsonschema", "soundfile==0.13.1", "xgrammar==0.2.1", "apache-tvm-ffi==0.1.11", "openai-harmony==0.0.4",
     "compressed-tensors", "gguf", "scipy", "tiktoken", "setproctitle", "uvloop", "python-multipart", "watchfiles",
     "zstandard", "distro", "prometheus-client>=0.20.0", "interegular", "blobfile==3.0.0"),
)
# Installed but not SGLang's to import: the router that sits in front of several engines runs from the runtime's
# own venv (pyproject.toml), so it is not needed here.


class SGLangEnvError(RuntimeError):
    pass


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_root() -> Path:
    if os.environ.get("SLIME_SGLANG_ENV_CACHE"):
        return Path(os.environ["SLIME_SGLANG_ENV_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slime-tcod" / "sglang-env"


def env_dir() -> Path:
    key = hashlib.sha256(json.dumps(PIP_LINES).encode()).hexdigest()[:12]
    return cache_root() / f"py{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}-{key}"


def env_python() -> Path:
    return env_dir() / "bin" / "python"


def is_built() -> bool:
    return (env_dir() / MARKER).is_file() and env_python().exists()


def find_base_python() -> str:
    want = "{}.{}".format(*PYTHON_VERSION)
    if sys.version_info[:2] == PYTHON_VERSION:
        return sys.executable
    candidates = [shutil.which(f"python{want}"),
                  *sorted(map(str, (Path.home() / ".pyenv/versions").glob(f"{want}.*/bin/python")), reverse=True)]
    for cand in candidates:
        if cand and subprocess.run([cand, "-c", f"import sys; assert sys.version_info[:2] == {PYTHON_VERSION}"],
                                   capture_output=True).returncode == 0:
            return cand
    raise SGLangEnvError(f"no Python {want} found (SGLang's torch wheels here are cp{want.replace('.', '')}): "
                         f"put python{want} on PATH")


def _pip(python: Path, words: tuple[str, ...], log) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *words]
    say(f"sglang env:   pip install {' '.join(words)}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    log.flush()
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise SGLangEnvError(f"pip install {' '.join(words)} failed (exit {proc.returncode}); full log: "
                             f"{log.name}\n{tail}")
    say(f"sglang env:     {time.monotonic() - t0:.0f} s")


def build() -> Path:
    """The environment's python, built first unless a complete one is cached. Two builds at once: the second
    waits for the first and then finds it."""
    target = env_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built():
            return env_python()
        base = find_base_python()
        shutil.rmtree(target, ignore_errors=True)
        say(f"sglang env: building {target} from {base} (SGLang {SGLANG_VERSION}; several minutes, once)")
        t0 = time.monotonic()
        subprocess.run([base, "-m", "venv", str(target)], check=True)
        with open(target / "pip-install.log", "w") as log:
            for words in PIP_LINES:
                _pip(target / "bin" / "python", words, log)
        check = subprocess.run([str(target / "bin/python"), "-c",
                                "import importlib.util as u, sys; "
                                "sys.exit(0 if u.find_spec('sglang.launch_server') else 1)"],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise SGLangEnvError(f"{target}: sglang.launch_server is not importable after the install: "
                                 f"{check.stderr[-400:]}")
        freeze = subprocess.run([str(target / "bin/python"), "-m", "pip", "list", "--format=freeze"],
                                capture_output=True, text=True).stdout
        (target / MARKER).write_text(json.dumps([list(w) for w in PIP_LINES]) + "\n" + freeze)
        say(f"sglang env: built in {time.monotonic() - t0:.0f} s")
    return env_python()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not build: print the python if built, else exit 1")
    a = parser.parse_args(argv)
    if a.check:
        if not is_built():
            say(f"sglang env: not built ({env_dir()}); build it with "
                "`python -m slime.backends.sglang_utils.sglang_env`")
            return 1
        print(env_python())
        return 0
    try:
        print(build())
    except (SGLangEnvError, subprocess.CalledProcessError) as err:
        say(f"sglang env: ERROR: {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
