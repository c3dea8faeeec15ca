"""Start an engine server process (real SGLang or the project's hf_engine), wait until it can
generate, and stop it cleanly.

``--rollout-backend sglang`` runs ``PYTHON -m sglang.launch_server`` with ``PYTHON`` = ``--sglang-python``
(default: this interpreter): SGLang pins a torch and transformers of its own, so it is served from a venv of its
own (``sglang_env.py`` builds one) and never imported here. Where this process sees no CUDA device the command
gets SGLang's CPU settings (``cpu_flags``, and ``SGLANG_USE_CPU_ENGINE=1``); where it does, it is the GPU
command. ``hf_engine`` runs ``python -m slime.backends.hf_engine`` (CPU, tests). Both speak the same HTTP
protocol, so the rest of the code only ever sees a base URL. The server's output goes to a log file whose tail
is quoted when the server dies or never becomes healthy.

A started server dies with the process that started it, however that one dies (``processes.py``):
the kernel kills it (Linux, PR_SET_PDEATHSIG), the hf_engine also watches ``--parent-pid`` itself, and SGLang,
which has no such flag, runs under ``child_watchdog.py``, which kills the server's process group once its
starter is gone.
A health answer counts only when it comes from the started server's own socket, so a busy port is
reported as the server's death (EADDRINUSE in its log), not as a healthy engine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from slime.backends.sglang_utils.processes import die_with_parent_preexec, port_listener_is


class EngineLaunchError(RuntimeError):
    """The server process exited or did not become healthy in time; the message quotes its log."""


class EngineDiedError(RuntimeError):
    """A server that was healthy exited during the run; the message quotes its log."""


def dead_engines(engines) -> EngineDiedError | None:
    """An error naming every engine of ``engines`` whose process has exited (with its log tail), or None.
    Engines without a local process (in Ray actors, or a router's workers) are not checked here."""
    dead = [e for e in engines if getattr(e, "process", None) is not None and e.process.poll() is not None]
    if not dead:
        return None
    return EngineDiedError("; ".join(
        f"the rollout engine at {e.url} exited with code {e.process.returncode} during the run "
        f"({e.cmd[0]} ... {' '.join(e.cmd[-2:])}); last lines of {e.log_path}:\n{e.log_tail(20)}" for e in dead))


# SGLang derives a gRPC port of its HTTP port + 10000 and refuses to start when that is above 65535 (0.5.15.post1:
# "SGLANG_GRPC_PORT (66331) must be between 1 and 65535"), and Linux hands out ephemeral ports up to 60999: a port
# picked here stays at or below this.
MAX_ENGINE_PORT = 55535


def find_free_port(host: str = "127.0.0.1", max_port: int = MAX_ENGINE_PORT) -> int:
    """A port free on ``host`` now, at most ``max_port``."""
    import random

    for attempt in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, 0 if attempt < 8 else random.randint(20000, max_port)))
            except OSError:
                continue
            port = s.getsockname()[1]
            if port <= max_port:
                return port
    raise OSError(f"no free port at or below {max_port} on {host}")


# SGLang's CPU settings (REFERENCE.md §14): its CPU engine, the attention and sampling backends that have a CPU
# path, no CUDA graphs or overlap thread, no warm-up request, and a KV pool sized in tokens (its memory-fraction
# rule would reserve a share of the machine's RAM). float32, as the trainer computes on a CPU.
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
CPU_MAX_TOTAL_TOKENS = 32768
# With the pool sized by --max-total-tokens, the fraction only enters SGLang's start-up check that the free memory
# it measured before loading the weights, less what it measures after, leaves that fraction: on a machine whose
# other processes allocate meanwhile, 0.05 failed ("Loaded weights leave no GPU memory for the KV cache ... Raise
# --mem-fraction-static above 0.132", with 1.3 GB free), so the CPU default tolerates such swings.
CPU_MEM_FRACTION_STATIC = 0.5


# Tried on SGLang 0.5.15.post1 (docs/en/engines.md): its deterministic mode accepts only the flashinfer, fa3, triton
# and ascend attention backends and refuses the CPU's (torch_native, intel_amx) at start.
CPU_DETERMINISTIC_REFUSED = (
    "--sglang-enable-deterministic-inference: SGLang refuses --enable-deterministic-inference on a CPU (its "
    "deterministic mode needs the flashinfer, fa3 or triton attention backend; the CPU has torch_native), so its "
    "sampling_seed is ignored there. For repeatable CPU runs use --rollout-backend hf_engine, or drop the flag")


def cpu_flags(args) -> list[str]:
    fraction = getattr(args, "sglang_mem_fraction_static", None) or CPU_MEM_FRACTION_STATIC
    return ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--disable-cuda-graph", "--disable-overlap-schedule", "--skip-server-warmup",
            "--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS), "--mem-fraction-static", str(fraction),
            "--dtype", "float32"]


def cuda_present() -> bool:
    """Whether this process sees a CUDA device (the servers it starts inherit its devices)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def sglang_python(args) -> str:
    """``--sglang-python``: the interpreter that runs SGLang servers (default: this one)."""
    return getattr(args, "sglang_python", None) or sys.executable


WATCHDOG = str(Path(__file__).resolve().parent / "child_watchdog.py")


def watched_module(python: str, module: str, parent_pid: int | None = None) -> list[str]:
    """``python -m module`` run under ``child_watchdog.py``: the server's process group is killed once
    ``parent_pid`` (default: this process) is gone, since neither SGLang nor sglang-router takes a --parent-pid."""
    return [python, WATCHDOG, "--parent-pid", str(parent_pid or os.getpid()), "--", "-m", module]


def build_sglang_command(args, *, model_path: str | None = None, host: str | None = None, port: int,
                         base_gpu_id: int | None = None, python: str | None = None,
                         cpu: bool | None = None) -> list[str]:
    """``python -m sglang.launch_server ...`` (under the watchdog) from the parsed arguments, SGLang's own flag
    names. ``cpu`` None: SGLang's CPU settings exactly when this process sees no CUDA device; the GPU command is
    left as it was."""
    cpu = (not cuda_present()) if cpu is None else cpu
    if cpu and getattr(args, "sglang_enable_deterministic_inference", False):
        raise EngineLaunchError(CPU_DETERMINISTIC_REFUSED)
    cmd = watched_module(python or sglang_python(args), "sglang.launch_server") + [
           "--model-path", str(model_path or args.hf_checkpoint),
           "--host", host or args.engine_host,
           "--port", str(port),
           "--tp-size", str(args.rollout_num_gpus_per_engine),
           "--random-seed", str(args.seed)]
    if getattr(args, "trust_remote_code", False):  # runs code shipped with the checkpoint: opt-in only
        cmd += ["--trust-remote-code"]
    if cpu:
        cmd += cpu_flags(args)
    elif getattr(args, "sglang_mem_fraction_static", None) is not None:
        cmd += ["--mem-fraction-static", str(args.sglang_mem_fraction_static)]
    if base_gpu_id is not None and not cpu:
        cmd += ["--base-gpu-id", str(base_gpu_id)]
    if getattr(args, "rollout_max_context_len", None):
        cmd += ["--context-length", str(args.rollout_max_context_len)]
    if getattr(args, "sglang_disable_radix_cache", False):
        cmd += ["--disable-radix-cache"]
    return cmd + _deterministic_flag(args)


def engine_env(cmd: list[str]) -> dict | None:
    """Environment additions a command needs: SGLang's CPU engine switch when it was given its CPU settings."""
    return dict(CPU_ENV) if "--device" in cmd and cmd[cmd.index("--device") + 1] == "cpu" else None


def _deterministic_flag(args) -> list[str]:
    """SGLang's ``--enable-deterministic-inference``, for both engines, exactly when upstream's
    ``--sglang-enable-deterministic-inference`` is given. Without it SGLang ignores the per-request
    sampling_seed and the hf_engine's numbers depend on what shares a batch: reruns part after a while."""
    return ["--enable-deterministic-inference"] if getattr(args, "sglang_enable_deterministic_inference", False) else []


def build_hf_engine_command(args, *, model_path: str | None = None, host: str | None = None, port: int,
                            max_batch_size: int | None = None, python: str = sys.executable) -> list[str]:
    cmd = [python, "-m", "slime.backends.hf_engine",
           "--model-path", str(model_path or args.hf_checkpoint),
           "--host", host or args.engine_host,
           "--port", str(port),
           "--random-seed", str(args.seed),
           "--parent-pid", str(os.getpid())]  # its watchdog exits when this process is gone
    batch = max_batch_size or getattr(args, "rollout_concurrency", None)
    if batch:
        cmd += ["--max-batch-size", str(batch)]
    if getattr(args, "rollout_max_context_len", None):
        cmd += ["--context-length", str(args.rollout_max_context_len)]  # as for SGLang
    if getattr(args, "sglang_disable_radix_cache", False):
        cmd += ["--disable-radix-cache"]  # the hf_engine takes SGLang's flag name
    return cmd + _deterministic_flag(args)


def build_engine_command(args, **kwargs) -> list[str]:
    backend = getattr(args, "rollout_backend", "hf_engine")
    if backend == "sglang":
        kwargs.pop("max_batch_size", None)
        return build_sglang_command(args, **kwargs)
    if backend == "hf_engine":
        kwargs.pop("base_gpu_id", None)
        kwargs.pop("cpu", None)
        return build_hf_engine_command(args, **kwargs)
    raise ValueError(f"--rollout-backend {backend!r}: expected 'hf_engine' or 'sglang'")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class EngineProcess:
    """A running engine server. Use as a context manager, or call :meth:`stop`."""

    def __init__(self, cmd: list[str], *, host: str, port: int, log_path: str | os.PathLike, env=None):
        self.cmd, self.host, self.port = cmd, host, port
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = dict(os.environ if env is None else env)
        env.update(engine_env(cmd) or {})
        # The hf_engine child must import this very package, installed or not.
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # A new session, so stop() can signal the server and any children it spawned (SGLang has several);
        # the session does not shield it from our death: PR_SET_PDEATHSIG is armed in the child, and an SGLang
        # server also runs under child_watchdog.py, which kills its group once this process is gone.
        try:
            self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, preexec_fn=die_with_parent_preexec())
        except OSError as err:  # e.g. a --sglang-python that does not exist
            self._log.close()
            raise EngineLaunchError(f"could not start {cmd[0]} ({err}); is --sglang-python a Python "
                                    "interpreter? (build one that serves SGLang with "
                                    "`python -m slime.backends.sglang_utils.sglang_env`)") from err

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def wait_healthy(self, timeout: float = 300.0, poll: float = 0.25) -> "EngineProcess":
        """Block until GET /health_generate answers 200 from this server; raise EngineLaunchError otherwise."""
        deadline = time.monotonic() + timeout
        foreign = False  # the port answered, but from another process's socket
        while True:
            code = self.process.poll()
            if code is not None:
                hint = (f"; port {self.port} is answered by another process, so this server probably could "
                        "not bind it") if foreign else ""
                raise EngineLaunchError(f"engine server exited with code {code} before becoming healthy{hint} "
                                        f"({' '.join(self.cmd)}); last log lines of {self.log_path}:\n"
                                        f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health_generate", timeout=max(poll, 5.0)) as resp:
                    ours = port_listener_is(self.port, self.process.pid) is not False
                    foreign = foreign or not ours
                    if resp.status == 200 and ours and self.process.poll() is None:
                        return self
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or not ready
            if time.monotonic() >= deadline:
                tail = self.log_tail()
                self.stop()
                busy = f" (port {self.port} is held by another process)" if foreign else ""
                raise EngineLaunchError(f"engine server at {self.url} was not healthy after {timeout:g}s{busy} "
                                        f"({' '.join(self.cmd)}); last log lines of {self.log_path}:\n{tail}")
            time.sleep(poll)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the server's process group, then SIGKILL it if it has not exited after ``grace`` s."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=grace)
        if not self._log.closed:
            self._log.close()
        return self.process.returncode

    def _signal(self, sig):
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


PORT_RACE_TRIES = 3  # starts of an engine whose self-picked port another process took first


def launch_engine(args, *, model_path: str | None = None, host: str | None = None, port: int | None = None,
                  log_dir: str | os.PathLike | None = None, timeout: float = 300.0, env=None,
                  **command_kwargs) -> EngineProcess:
    """Start the engine chosen by ``--rollout-backend`` and wait until it can generate.

    A port picked here (``port`` None) is free when picked but released before the server binds it, so
    another process can take it in between; a server that then dies with EADDRINUSE is started again on a
    new port (``PORT_RACE_TRIES`` in all). A port given by the caller is used once.
    """
    host = host or getattr(args, "engine_host", "127.0.0.1")
    log_dir = Path(log_dir or os.environ.get("SLIME_ENGINE_LOG_DIR", "/tmp/slime_engines"))
    tries = 1 if port else PORT_RACE_TRIES
    for attempt in range(1, tries + 1):
        chosen = port or find_free_port(host)
        cmd = build_engine_command(args, model_path=model_path, host=host, port=chosen, **command_kwargs)
        engine = EngineProcess(cmd, host=host, port=chosen, log_path=log_dir / f"engine_{host}_{chosen}.log",
                               env=env)
        try:
            return engine.wait_healthy(timeout)
        except BaseException as err:
            engine.stop()
            if not (isinstance(err, EngineLaunchError) and attempt < tries and lost_its_port(engine)):
                raise


def lost_its_port(engine: EngineProcess) -> bool:
    """The server exited because its port was taken (EADDRINUSE in its log)."""
    tail = engine.log_tail().lower()
    return engine.process.poll() is not None and ("address already in use" in tail or "errno 98" in tail)
