"""Where upstream's CPU CI jobs run here: a cached Python 3.10 virtualenv per job, a throwaway one per tree, and one
registered file run in it as the job runs it (``python tests/FILE`` from the tree's root); cpu_ci.py drives.

The venvs live under ``$CPU_CI_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/slime-tcod/cpu-ci``): a base venv holding
the pip lines every CPU job shares, and for a job with more a venv layered on it (a ``.pth`` adds the base's
site-packages after its own; pip in a virtualenv never uninstalls what lies outside it); a folder's name hashes its
pip lines; ``CPU_CI_REBUILD=1`` rebuilds. When download.pytorch.org (the template's torch index) is out of reach,
torch comes from PyPI (``$CPU_CI_TORCH``, default ``torch==2.13.0``: the CUDA build, ~4.6 GB, runs on CPU), said so.
``PY310`` names the interpreter (default ``python3.10`` on PATH, else pyenv's newest 3.10).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tools.slime_pr.trees import say

TORCH_INDEX_PROBE = "https://download.pytorch.org/whl/cpu/torch/"
DEFAULT_TORCH = "torch==2.13.0"
PIP_NOISE = ("is ignored: it is neither a file nor a directory", "[notice]", "DEPRECATION:")
MARKER = ".slime-tcod-complete"
# What the CPU jobs' `env:` block gives each run, secrets left out (forks get none either).
JOB_ENV = {"CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_COMMIT_NAME": "local_non-pr",
           "SLIME_TEST_ENABLE_INFINITE_RUN": "false", "SLIME_TEST_USE_DEEPEP": "0", "SLIME_TEST_USE_FP8_ROLLOUT": "0",
           "SLIME_TEST_ENABLE_EVAL": "1"}
SUMMARY_LINE = re.compile(r"^=+ (?P<body>.*?) in [0-9.]+s(?: \([^)]*\))? =+$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


class CIError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------ the venvs
def find_py310(version: str) -> str:
    want = os.environ.get("PY310")
    candidates = [want] if want else []
    if not want:
        candidates += [shutil.which(f"python{version}") or ""]
        pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        candidates += [str(p / "bin/python") for p in sorted(pyenv.glob(f"{version}.*"), reverse=True)]
    for c in filter(None, candidates):
        try:
            out = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return c
        if want:
            raise CIError(f"PY310={want} is Python {out.stdout.strip() or '?'}, not {version}")
    raise CIError(f"no Python {version} found (the CPU jobs' setup-python version); set PY310 to one")


def _torch_index_reachable() -> bool:
    try:
        with urllib.request.urlopen(TORCH_INDEX_PROBE, timeout=5):
            return True
    except Exception:
        return False


def effective_pip(lines, reachable: bool | None = None) -> tuple[list[tuple[str, ...]], list[str]]:
    """The pip lines as run here, and notes on what differs from the template."""
    out, notes = [], []
    for words in lines:
        if "--index-url" in words and words[0] == "torch":
            if reachable is None:
                reachable = _torch_index_reachable()
            if not reachable:
                torch = os.environ.get("CPU_CI_TORCH", DEFAULT_TORCH)
                i = words.index("--index-url")
                template_line = " ".join(words)
                words = (torch, *words[1:i], *words[i + 2 :])
                notes.append(
                    f"download.pytorch.org is not reachable from here: `pip install {template_line}` runs as "
                    f"`pip install {' '.join(words)}` from PyPI, which is the CUDA build (with its nvidia-* wheels, "
                    "about 4.6 GB); it runs on CPU as the CPU build does (set CPU_CI_TORCH for another pin)"
                )
        out.append(tuple(words))
    return out, notes


def _site(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise CIError(f"{venv} has no lib/python3*/site-packages")
    return found[0]


def _pip(python: Path, words, log) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *words]
    say(f"  $ pip install {' '.join(words)}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines() if not any(n in ln for n in PIP_NOISE))
    log.write(f"$ {' '.join(cmd)}\n{text}\n")
    if proc.returncode != 0:
        raise CIError(f"pip install {' '.join(words)} failed (exit {proc.returncode}):\n" + "\n".join(
            "    " + ln for ln in text.splitlines()[-25:]))
    done = [ln for ln in text.splitlines() if ln.startswith("Successfully installed")]
    say(f"    {time.monotonic() - t0:.0f}s; " + (done[-1][:300] if done else "nothing new to install"))


def _layer(venv: Path, below: Path) -> None:
    """Put ``below``'s site-packages (and what its .pth files add) on ``venv``'s path, after its own."""
    line = f"import site; site.addsitedir({str(_site(below))!r})\n"
    (_site(venv) / "_slime_tcod_layer.pth").write_text(line)


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def cache_root() -> Path:
    if os.environ.get("CPU_CI_CACHE"):
        return Path(os.environ["CPU_CI_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slime-tcod" / "cpu-ci"


def _build(venv: Path, py: str, lines, below: Path | None, what: str, force: bool = False) -> bool:
    """Build ``venv`` unless it is complete already; returns whether it was (re)built."""
    if (venv / MARKER).is_file() and not force and os.environ.get("CPU_CI_REBUILD") != "1":
        say(f"{what}: cached {venv}")
        return False
    if os.environ.get("VERIFY_NO_INSTALL") == "1":
        raise CIError(f"{what}: {venv} is not built and VERIFY_NO_INSTALL=1 forbids installing")
    shutil.rmtree(venv, ignore_errors=True)
    say(f"{what}: building {venv}")
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    if below is not None:
        _layer(venv, below)
    with open(venv / "pip-install.log", "w") as log:
        for words in lines:
            _pip(venv / "bin/python", words, log)
    freeze = subprocess.run([str(venv / "bin/python"), "-m", "pip", "list", "--format=freeze",
                             "--disable-pip-version-check"], capture_output=True, text=True).stdout
    (venv / MARKER).write_text(json.dumps({"pip": [list(w) for w in lines], "below": str(below or "")}) + "\n" + freeze)
    return True


def build_envs(jobs) -> tuple[dict[str, Path], str]:
    """({job name: its venv}, torch's version there), built when absent. The lines all CPU jobs begin with go
    into one base venv."""
    versions = {j.python for j in jobs}
    if len(versions) != 1:
        raise CIError(f"the CPU jobs set up different Pythons ({sorted(versions)}); this driver expects one")
    version = versions.pop()
    py = find_py310(version)
    pyver = subprocess.run([py, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                           text=True, check=True).stdout.strip()
    shared = 0
    while all(len(j.pip) > shared for j in jobs) and len({j.pip[shared] for j in jobs}) == 1:
        shared += 1
    base_lines, notes = effective_pip(jobs[0].pip[:shared])
    root = cache_root()
    say(f"Python {pyver} ({py}); cache {root}")
    for note in notes:
        say(f"NOTE: {note}")
    root.mkdir(parents=True, exist_ok=True)
    envs = {}
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another verify.sh building the same cache waits here
        base = root / f"py{version}-base-{_key(pyver, base_lines)}"
        rebuilt = _build(base, py, base_lines, None,
                         f"base venv ({shared} pip lines shared by {', '.join(j.name for j in jobs)})")
        for job in jobs:
            extra, _ = effective_pip(job.pip[shared:], reachable=True)
            if not extra:
                envs[job.name] = base
                continue
            venv = root / f"py{version}-{job.name}-{_key(pyver, base_lines, extra)}"
            # A layer resolved against an older base is rebuilt with it.
            _build(venv, py, extra, base, f"{job.name} venv (base + {len(extra)} pip line(s))", force=rebuilt)
            envs[job.name] = venv
    torch = subprocess.run([str(envs[jobs[0].name] / "bin/python"), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    say(f"torch in the CPU-CI venvs: {torch.stdout.strip() or 'NOT IMPORTABLE: ' + torch.stderr.strip()[-300:]}")
    for job in jobs:
        say(f"  {job.name}: {envs[job.name]}  (pip: " + "; ".join(" ".join(w) for w in job.pip) + ")")
    return envs, torch.stdout.strip() or "?"


def tree_venv(work: Path, job_venv: Path, tree: Path, label: str, log) -> Path:
    """A venv of ``tree`` on top of ``job_venv``: `pip install -e . --no-deps` from the tree's root."""
    venv = work / f"venv-{label}"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([str(job_venv / "bin/python"), "-m", "venv", "--without-pip", str(venv)], check=True)
    _layer(venv, job_venv)
    cmd = [str(job_venv / "bin/python"), "-m", "pip", "--python", str(venv / "bin/python"), "install",
           "--disable-pip-version-check", "-e", ".", "--no-deps"]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    log.write(f"$ (cd {tree} && pip install -e . --no-deps)  [{venv}]\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise CIError(f"pip install -e . --no-deps failed in {tree} (exit {proc.returncode}): {proc.stderr[-800:]}")
    return venv


# ------------------------------------------------------------------------------------------ one file
@dataclasses.dataclass
class Result:
    rc: int | str
    seconds: float
    counts: dict
    log: Path

    @property
    def passed(self) -> bool:
        return self.rc == 0

    @property
    def strict(self) -> bool:
        """Ends in `N passed`, nothing else but warnings."""
        other = {k for k in self.counts if k not in ("passed", "warning", "warnings")}
        return self.rc == 0 and self.counts.get("passed", 0) > 0 and not other

    def label(self) -> str:
        body = ", ".join(f"{n} {k}" for k, n in self.counts.items() if not k.startswith("warning"))
        head = "pass" if self.rc == 0 else ("TIMEOUT" if self.rc == "timeout" else f"FAIL (exit {self.rc})")
        if self.rc == 0 and not body:  # upstream files without a pytest runner: the script defines tests only
            head, body = "exit 0", "no pytest run"
        return f"{head} ({body or 'no pytest summary'}; {self.seconds:.0f}s)"


def parse_counts(text: str) -> dict:
    for line in reversed(text.splitlines()):
        m = SUMMARY_LINE.match(line.strip())
        if m:
            counts = {}
            for n, kind in COUNT.findall(m.group("body")):
                counts["error" if kind == "errors" else kind] = int(n)
            return counts
    return {}


def run_file(venv: Path, tree: Path, rel: str, args: str, log: Path, timeout: int) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLIME_CONTRACT_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(JOB_ENV)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    t0 = time.monotonic()
    with open(log, "w") as fh:
        fh.write(f"$ cd {tree} && python {rel} {args}\n\n")
        fh.flush()
        # Its own process group, so that a timeout (or workers it leaves behind) ends all of it, and only it.
        proc = subprocess.Popen([str(venv / "bin/python"), rel, *shlex.split(args)], cwd=tree, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return Result(rc, time.monotonic() - t0, parse_counts(log.read_text(errors="replace")), log)


def tail(path: Path, n: int = 12) -> str:
    return "\n".join("        " + ln for ln in path.read_text(errors="replace").splitlines()[-n:])
