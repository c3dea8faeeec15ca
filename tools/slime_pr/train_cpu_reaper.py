"""No process of a train_cpu case outlives it: every process the case starts carries one token in its environment,
and a sweep ends every process that holds it.

SGLang has no ``--parent-pid``, and slime's own engine actors start SGLang servers deep inside Ray workers whose
process groups the harness never sees; an environment variable is inherited by all of them (Ray's raylet and its
workers, multiprocessing children, SGLang's scheduler and detokenizer). Two guards use it:

* :func:`sweep` at the end of every case (ok, failed, timed out or interrupted);
* a watchdog (:func:`start_watchdog`): a small process in a session of its own, reading a pipe the harness holds.
  When the harness dies, however (``kill -9`` included), the pipe reads EOF and the watchdog sweeps.

    python -m tools.slime_pr.train_cpu_reaper TOKEN     # the watchdog itself (stdin: the harness's pipe)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ENV_KEY = "SLIME_TRAIN_CPU_RUN"


def new_token() -> str:
    return uuid.uuid4().hex


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, session id)} of every process now running."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return table


def holders(token: str) -> list[int]:
    """The pids (other than this process) of the case: those whose environment holds ``ENV_KEY=token``, their
    descendants, and the other members of their sessions when that session is not this process's own. The last two
    matter: SGLang's scheduler and detokenizer (and Ray's workers) rename themselves with setproctitle, which
    overwrites the memory /proc/PID/environ reads, so their token is no longer visible there."""
    needle = f"{ENV_KEY}={token}".encode()
    me, my_session = os.getpid(), os.getsid(0)
    table = _processes()
    marked = set()
    for pid in table:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone already, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            marked.add(pid)
    sessions = {table[pid][1] for pid in marked if pid in table} - {my_session, 0, 1}
    found = marked | {pid for pid, (_, sid) in table.items() if sid in sessions}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    # never this process or the ones it descends from (a test runs the harness in-process)
    ancestors, pid = set(), me
    while pid in table and pid not in ancestors:
        ancestors.add(pid)
        pid = table[pid][0]
    return sorted(found - ancestors)


def sweep(token: str, grace_s: float = 10.0) -> list[int]:
    """SIGTERM every holder (SGLang drains and ends its children on it), SIGKILL what is left after ``grace_s``.
    Returns the pids that were found."""
    first = holders(token)
    for pid in first:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and holders(token):
        time.sleep(0.5)
    for _ in range(3):  # a process may fork while we kill: sweep until none is left
        left = holders(token)
        if not left:
            break
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.5)
    return first


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_watchdog(token: str) -> subprocess.Popen:
    """The watchdog for ``token``. Keep the returned object alive: its stdin is the pipe whose EOF means the
    harness is gone. It runs in a session of its own, so Ctrl-C at the terminal does not end it first."""
    env = {k: v for k, v in os.environ.items() if k != ENV_KEY}  # it must not sweep itself
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo
    return subprocess.Popen([sys.executable, "-m", "tools.slime_pr.train_cpu_reaper", token], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=repo,
                            start_new_session=True)


def stop_watchdog(watchdog: subprocess.Popen) -> None:
    """The harness ends normally: close the pipe (the watchdog sweeps once more, finding nothing) and reap it."""
    try:
        watchdog.stdin.close()
        watchdog.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        watchdog.kill()


def _watch(token: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(1 << 12):  # the harness never writes: this returns b"" when it is gone
        pass
    sweep(token)
    return 0


if __name__ == "__main__":
    sys.exit(_watch(sys.argv[1]))
