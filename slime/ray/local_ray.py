"""Stop the local Ray that ``train.py`` started (``ray.init`` without an address), leaving none of its processes.

``ray.shutdown()`` terminates the processes it started itself (GCS, raylet, log monitor, dashboard), giving
each one second before SIGKILL. It does not stop the raylet's children: its dashboard and runtime-env agents
find out by polling that the raylet is gone and, when it did not end by SIGTERM (killed after that second on
a busy machine, or hit by a terminal's Ctrl-C), first report it to the GCS, which is gone too; two of them
were seen outliving a run by 60-80 s. So the Ray processes and everything below them are recorded while the
cluster runs, and whatever of them is still alive a few seconds after ``ray.shutdown()`` is killed.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


def _psutil():
    import ray  # noqa: F401 - puts Ray's bundled psutil on sys.path

    import psutil

    return psutil


def registered_cluster(timeout: float = 0.5) -> str | None:
    """The address of a live cluster that ``ray start`` registered on this machine, or None (none, or only
    its leftover registration: the head is gone). ``train.py`` names it without joining it."""
    from ray._private.utils import read_ray_address

    address = read_ray_address()
    if not address:
        return None
    host, _, port = address.rpartition(":")
    import socket

    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return address
    except (OSError, ValueError):
        return None


def join_with_token() -> None:
    """Before ``ray.init(address=...)``: use this machine's Ray token as ``ray start`` does. A ``ray start`` head
    (Ray >= 2.52) requires token authentication, but a driver joining it sends its token only with
    ``RAY_AUTH_MODE=token``: without it every join retried for 20 s and failed. An explicit mode is kept."""
    try:
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


class LocalRay:
    """The processes of the Ray cluster this process started: ``record()`` them, ``stop()`` them all."""

    def __init__(self):
        self._procs: dict[int, object] = {}  # pid -> psutil.Process (keeps the start time against pid reuse)

    def _roots(self) -> list[int]:
        import ray

        node = ray._private.worker._global_node  # None when connected to a cluster that is not ours
        if node is None or not node.is_head():
            return []
        return [info.process.pid for infos in node.all_processes.values() for info in infos]

    def record(self) -> int:
        """Remember the cluster's processes and their descendants (agents, workers); returns how many are known."""
        psutil = _psutil()
        for pid in self._roots():
            try:
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    self._procs.setdefault(proc.pid, proc)
            except psutil.Error:
                continue
        return len(self._procs)

    def alive(self) -> list:
        psutil = _psutil()
        out = []
        for proc in self._procs.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def stop(self, grace: float = 5.0) -> int:
        """``ray.shutdown()``, then SIGKILL what is left of the recorded processes after ``grace`` s.

        Returns how many had to be killed."""
        import ray

        psutil = _psutil()
        self.record()
        try:
            ray.shutdown()
        except Exception as err:  # noqa: BLE001 - the processes are killed below either way
            logger.warning("ray.shutdown() failed: %r", err)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        late = self.alive()
        for proc in late:
            try:
                proc.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(late, timeout=grace)
        if late:
            logger.debug("killed %d Ray process(es) left after ray.shutdown(): %s", len(late),
                         [p.pid for p in late])
        return len(late)
