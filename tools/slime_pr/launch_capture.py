"""The argument lists ``check_launch_flags.py`` checks: the launch script run with recording stand-ins for ``python3``,
``ray``, ``curl``, ``nvidia-smi`` and ``sleep``, and the GPU e2e test with ``U.execute_train`` and the teacher's
``Popen`` captured. Nothing is launched."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path

try:
    from .manifest import GPU_CONFIGS, GPU_TEST_FILE
except ImportError:  # imported as a top-level module, from this folder
    from manifest import GPU_CONFIGS, GPU_TEST_FILE

SCRIPT = "examples/multi_turn_tcod/run-qwen3-8B-tcod.sh"
E2E_TEST = GPU_TEST_FILE
# The script in both TCOD modes, then its 4-GPU setting as the example README gives it (Qwen3-1.7B, Qwen3-8B teacher).
SMALLER_SETTING = {"STUDENT": "/root/models/Qwen3-1.7B", "STUDENT_TORCH_DIST": "/root/models/Qwen3-1.7B_torch_dist",
                   "TEACHER": "/root/models/Qwen3-8B", "MODEL_SCRIPT": "qwen3-1.7B.sh", "NUM_GPUS": "4",
                   "TEACHER_GPUS": "1", "ACTOR_GPUS": "1", "TP": "1"}
SCRIPT_RUNS = [{"TCOD_MODE": m} for m in ("f2b", "b2f")] + [{"TCOD_MODE": "f2b", **SMALLER_SETTING}]
# The e2e test's configurations as the CI registers them (one entry each, with the GPUs it gets).
TEST_GPUS = {(m, o): n for m, o, n in GPU_CONFIGS}
TEST_RUNS = list(TEST_GPUS)
# Checkpoint flags whose path upstream's validation requires to exist.
MUST_EXIST = ("--ref-load", "--opd-teacher-load")
# ServerArgs fields the launches use, as SGLang 0.5.15.post1 declares them (kind, default), for runs without
# the wheel; pp/dp size and dp attention are read by upstream's sglang validate_args.
SGLANG_FALLBACK = {"mem_fraction_static": ("float", None), "pp_size": ("int", 1), "dp_size": ("int", 1),
                   "enable_dp_attention": ("bool", False)}
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")

# Stand-ins that record their argv: one NUL-separated file per call (cwd, name, args...), written under a
# temp name and renamed, so that a half-written record is never read.
_RECORD = (
    'f=$(mktemp "$CAPTURE_DIR/.call.XXXXXX")\n'
    'printf "%s\\0" "$PWD" "$(basename "$0")" "$@" > "$f"\n'
    'mv "$f" "$CAPTURE_DIR/call.${f##*.}"\n'
)
STUBS = {
    "python3": _RECORD,
    "ray": _RECORD,
    # The teacher is started in the background: report it healthy only once its launch is recorded,
    # or the script's exit trap may kill it first.
    "curl": _RECORD
    + 'for i in $(seq 100); do grep -lqs sglang.launch_server "$CAPTURE_DIR"/call.* && break; /bin/sleep 0.1; done\n'
    + "echo '{}'\n",
    "nvidia-smi": "exit 1\n",
    "sleep": "exit 0\n",
}


@dataclass
class Launch:
    name: str
    argv: list[str]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)  # the Ray job's runtime env_vars
    teacher_argv: list[str] | None = None  # python3 -m sglang.launch_server's arguments
    problems: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- (a) argument lists
def flags_of(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def script_launches(slime_dir: Path, keep_dir: Path) -> list[Launch]:
    """Run the launch script with recording stand-ins; one Launch per TCOD_MODE. Files the script wrote and names
    on the command line (the gridnav YAML) are moved to ``keep_dir``."""
    launches = []
    for run in SCRIPT_RUNS:
        name = f"{SCRIPT} " + " ".join(f"{k}={v}" for k, v in run.items())
        with tempfile.TemporaryDirectory() as tmp:
            stub_dir, capture = Path(tmp, "bin"), Path(tmp, "calls")
            for folder in (stub_dir, capture):
                folder.mkdir()
            for stub, body in STUBS.items():
                (stub_dir / stub).write_text("#!/bin/sh\n" + body)
                (stub_dir / stub).chmod(0o755)
            env = {**os.environ, **run, "PATH": f"{stub_dir}:{os.environ['PATH']}", "CAPTURE_DIR": str(capture)}
            env["SAVE"] = str(Path(tmp, "save"))  # the gridnav YAML is written there
            script = ["bash", str(slime_dir / SCRIPT)]
            proc = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
            calls = [p.read_bytes().decode().split("\0")[:-1] for p in capture.glob("call.*")]
            submits = [c for c in calls if c[1] == "ray" and c[2:4] == ["job", "submit"]]
            launch = Launch(name, [], str(slime_dir))
            if proc.returncode != 0:
                launch.problems.append(f"the script exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
            if len(submits) != 1:
                launch.problems.append(f"expected one `ray job submit`, saw {len(submits)}")
            else:
                cwd, _, *args = submits[0]
                launch.cwd = cwd
                job = args[args.index("--") + 1 :] if "--" in args else []
                if job[:2] != ["python3", "train.py"]:
                    launch.problems.append(f"the job is not `python3 train.py ...`: {job[:2]}")
                launch.argv = job[2:]
                launch.env, problems = _runtime_env(args)
                launch.problems += problems
            teachers = [c[4:] for c in calls if c[1] == "python3" and c[2:4] == ["-m", "sglang.launch_server"]]
            if len(teachers) != 1:
                launch.problems.append(f"expected one teacher server (python3 -m sglang.launch_server), saw "
                                       f"{len(teachers)}")
            else:
                launch.teacher_argv = teachers[0]
            # Copy the YAML out of the temp dir before it goes: validation reads it later.
            launch.argv = _keep_temp_files(launch.argv, Path(tmp), keep_dir)
        launches.append(launch)
    return launches


def _runtime_env(ray_args: list[str]) -> tuple[dict[str, str], list[str]]:
    """The env_vars of ``ray job submit --runtime-env-json``, and a problem if it is not JSON."""
    for i, arg in enumerate(ray_args):
        if arg.startswith("--runtime-env-json"):
            text = arg.split("=", 1)[1] if "=" in arg else ray_args[i + 1]
            try:
                return json.loads(text).get("env_vars", {}), []
            except ValueError as err:
                return {}, [f"--runtime-env-json is not JSON ({err}): {text!r}"]
    return {}, ["`ray job submit` has no --runtime-env-json"]


def _keep(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _keep_temp_files(argv: list[str], tmp: Path, keep_dir: Path) -> list[str]:
    """``argv`` with each file of ``tmp`` it names copied to a folder of ``keep_dir``, which outlives ``tmp``."""
    return [_keep(Path(tempfile.mkdtemp(dir=keep_dir), Path(a).name), Path(a).read_text())
            if a.startswith(str(tmp)) and Path(a).is_file() else a for a in argv]


def _model_args(slime_dir: Path, model_type: str | None) -> list[str]:
    """``MODEL_ARGS`` of upstream's scripts/models/<type>.sh, as execute_train's ``source`` expands it."""
    if model_type is None:
        return []
    script = slime_dir / "scripts" / "models" / f"{model_type}.sh"
    source = ["bash", "-c", 'source "$1" && printf "%s\\0" "${MODEL_ARGS[@]}"', "_", str(script)]
    return subprocess.run(source, capture_output=True, text=True, check=True).stdout.split("\0")[:-1]


class _Captured(Exception):
    pass


def test_launches(slime_dir: Path, keep_dir: Path) -> list[Launch]:
    """The e2e test's CI runs, with ``U.execute_train`` recording instead of launching (temp files in keep_dir)."""
    import slime.utils.external_utils.command_utils as U

    spec = importlib.util.spec_from_file_location("_tcod_e2e_test", slime_dir / E2E_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    launches = []
    saved_env = dict(os.environ)
    saved = U.execute_train, U.exec_command, U.save_to_temp_file
    seen = {}

    def record(train_args, num_gpus_per_node, megatron_model_type, before_ray_job_submit=None, **kwargs):
        seen.update(train_args=train_args, model_type=megatron_model_type, teacher=None)
        if before_ray_job_submit is not None:
            try:  # the teacher launch, with Popen recording its command instead of running it
                before_ray_job_submit()
            except _Captured:
                pass
        raise _Captured

    def record_popen(cmd, **kwargs):
        seen["teacher"] = list(cmd)
        raise _Captured

    try:
        for tcod_mode, opd_type in TEST_RUNS:
            name = f"{E2E_TEST} --tcod-mode {tcod_mode} --opd-type {opd_type}"
            seen.clear()
            U.execute_train, U.exec_command = record, lambda *a, **k: ""
            U.save_to_temp_file = lambda text, ext: _keep(Path(tempfile.mkdtemp(dir=keep_dir), f"file.{ext}"), text)
            module.subprocess = types.SimpleNamespace(Popen=record_popen, STDOUT=None)
            module.open = lambda *a, **k: io.StringIO()  # the teacher's log file
            # The GPUs gpu_lock_exec.py gives this configuration's CI entry.
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(TEST_GPUS[tcod_mode, opd_type])))
            # The runtime env execute_train gives the job (Megatron checks this variable when TP > 1).
            launch = Launch(name, [], str(slime_dir), env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # the test's own progress prints
                    module.execute(tcod_mode, opd_type, *module._get_gpu_split(opd_type))  # as its __main__
                launch.problems.append("execute() returned without calling U.execute_train")
            except _Captured:
                launch.argv = _model_args(slime_dir, seen["model_type"]) + shlex.split(seen["train_args"])
                teacher = seen["teacher"]
                if teacher is not None and teacher[1:3] == ["-m", "sglang.launch_server"]:
                    launch.teacher_argv = teacher[3:]
                if (opd_type == "sglang") != (launch.teacher_argv is not None):
                    launch.problems.append("a teacher server must be launched iff --opd-type sglang")
            launches.append(launch)
    finally:
        U.execute_train, U.exec_command, U.save_to_temp_file = saved
        os.environ.clear()
        os.environ.update(saved_env)
    return launches
