"""Run a Python module as ``__main__`` and kill its whole process group once a given process is gone.

    PYTHON child_watchdog.py --parent-pid PID -- -m sglang.launch_server --model-path ...

Real SGLang has no ``--parent-pid`` (the hf_engine has one), and neither has sglang-router, so a server started
by train.py, the test suite or a shell script could outlive it: an orphaned SGLang keeps ~3 GB and, on a GPU, its
device. This file is run *by path* with whatever Python serves (``--sglang-python``), so it uses the standard
library only and imports nothing of this repository. It

* makes itself the leader of a process group of its own (a shell's background job shares the script's group),
  so everything the server spawns (SGLang's scheduler and detokenizer processes) is in that group;
* starts a daemon thread that polls PID every half second; once PID is gone (or, PID being the direct parent,
  this process was re-parented) it SIGKILLs the group, itself included: nothing is left to drain for;
* then runs the module as ``python -m`` would (``runpy``), in this same process, so the server's pid is the one
  its starter holds and a SIGTERM to it reaches the server itself (SGLang drains and stops its children).
"""

import os
import runpy
import signal
import sys
import threading
import time

USAGE = "usage: child_watchdog.py --parent-pid PID [--poll S] -- -m MODULE [ARGS...]"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


def _watch(pid, poll):
    direct = os.getppid() == pid
    while True:
        if (direct and os.getppid() != pid) or not _alive(pid):
            sys.stderr.write(f"child_watchdog: process {pid}, which started this server, is gone: killing the "
                             f"server's process group {os.getpgrp()}\n")
            sys.stderr.flush()
            os.killpg(os.getpgrp(), signal.SIGKILL)
            os._exit(1)  # only reached if the group could not be signalled
        time.sleep(poll)


def main(argv):
    try:
        split = argv.index("--")
        opts, rest = argv[:split], argv[split + 1:]
        pid = int(opts[opts.index("--parent-pid") + 1])
        poll = float(opts[opts.index("--poll") + 1]) if "--poll" in opts else 0.5
        if rest[0] != "-m" or len(rest) < 2:
            raise ValueError
    except (ValueError, IndexError):
        sys.exit(USAGE)
    if os.getpgrp() != os.getpid():
        try:
            os.setpgid(0, 0)
        except OSError:  # already a session leader elsewhere; killing the group it is in would be wrong
            pass
    if os.getpgrp() == os.getpid():
        threading.Thread(target=_watch, args=(pid, poll), name="child-watchdog", daemon=True).start()
    module = rest[1]
    sys.argv = [module, *rest[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
