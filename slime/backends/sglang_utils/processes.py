"""Process helpers for engine servers: die with the parent, watch a pid, tell who listens on a port.

An engine must not outlive the run that started it, however that run dies (SIGKILL included): an
orphaned engine keeps serving and, on a GPU, keeps the device. Two mechanisms, because real SGLang's
code cannot be changed:

* :func:`die_with_parent_preexec` (Linux): the kernel SIGKILLs the child when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``). SGLang's own subprocesses arm the same signal against SGLang's main
  process, so the whole server goes. Caveat of the kernel API: "parent" is the *thread* that started
  the child, so start engines from a thread that lives as long as the run (train.py's main thread).
* :func:`watch_parent`: a daemon thread inside servers we own (the hf_engine, ``--parent-pid``) that
  exits the process once the parent is gone; it also works where prctl does not exist.

:func:`port_listener_is` lets a health wait check that the server answering on a port is the one it
started, not another process that held the port (our server then dies with EADDRINUSE).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
logger = logging.getLogger(__name__)


def die_with_parent_preexec():
    """A ``preexec_fn`` arming PR_SET_PDEATHSIG=SIGKILL in the child, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: no dlopen between fork and exec
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return preexec


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(pid, 0) is all we know
    return state not in ("Z", "X")


def watch_parent(pid: int, poll: float = 0.5) -> threading.Thread:
    """Exit this process (code 1) once process ``pid`` is gone. Returns the started daemon thread.

    When ``pid`` is our direct parent, being re-parented also counts: that sees a dead parent at once,
    even while it is an unreaped zombie, and cannot be fooled by the pid being reused.
    """
    direct = os.getppid() == pid

    def run():
        while True:
            if (direct and os.getppid() != pid) or not pid_alive(pid):
                logger.warning("parent process %d is gone: exiting so as not to outlive it", pid)
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                os._exit(1)
            time.sleep(poll)

    thread = threading.Thread(target=run, name="parent-watchdog", daemon=True)
    thread.start()
    logger.info("exiting when process %d is gone", pid)
    return thread


def _listening_inodes(port: int) -> set[str] | None:
    """Inodes of the TCP sockets listening on ``port`` (this network namespace), None without /proc."""
    inodes, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes if readable else None


def _process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (a launcher may serve from a child process)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(children.get(p, []))
    return tree


def port_listener_is(port: int, pid: int) -> bool | None:
    """Whether the socket listening on ``port`` belongs to ``pid`` (or a descendant).

    None when it cannot be told: no /proc, no local listener (the server is on another host), or the
    process's descriptors cannot be read (another user's).
    """
    listening = _listening_inodes(port)
    if not listening:
        return None
    readable = False
    for p in _process_tree(pid):
        try:
            fds = list(Path(f"/proc/{p}/fd").iterdir())
        except OSError:
            continue
        readable = True
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in listening:
                return True
    return False if readable else None
