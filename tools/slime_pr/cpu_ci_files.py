"""One test file of upstream's CPU CI run as the job runs it (``python tests/FILE`` from the tree's root), and
its pytest summary read back; cpu_ci.py drives the jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

# What the CPU jobs' `env:` block gives each run, secrets left out (forks get none either).
JOB_ENV = {
    "CI": "true",
    "GITHUB_ACTIONS": "true",
    "GITHUB_COMMIT_NAME": "local_non-pr",
    "SLIME_TEST_ENABLE_INFINITE_RUN": "false",
    "SLIME_TEST_USE_DEEPEP": "0",
    "SLIME_TEST_USE_FP8_ROLLOUT": "0",
    "SLIME_TEST_ENABLE_EVAL": "1",
}
SUMMARY_LINE = re.compile(r"^=+ (?P<body>.*?) in [0-9.]+s(?: \([^)]*\))? =+$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


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
    cmd = [str(venv / "bin/python"), rel, *shlex.split(args)]
    t0 = time.monotonic()
    with open(log, "w") as fh:
        fh.write(f"$ cd {tree} && python {rel} {args}\n\n")
        fh.flush()
        # Its own process group, so that a timeout (or workers it leaves behind) ends all of it, and only it.
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds = time.monotonic() - t0
    return Result(rc, seconds, parse_counts(log.read_text(errors="replace")), log)


def _tail(path: Path, n: int = 12) -> str:
    return "\n".join("        " + ln for ln in path.read_text(errors="replace").splitlines()[-n:])
