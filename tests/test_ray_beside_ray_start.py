"""train.py without --ray-address runs its own local Ray beside what ``ray start`` left on the machine.

Before: ``ray.init()`` without an address joins the cluster ``ray start`` registered (its address file in Ray's
temp folder), live or long gone, and train.py's ``num_cpus`` then ended every run in ``ValueError: When
connecting to an existing cluster, num_cpus and num_gpus must not be provided``. Now a live head is named and
not joined (``--ray-address`` joins it, and train.py says so), and a stale registration is ignored.

A real ``ray start --head`` on a free port, in a temp folder of this test's own (``RAY_TMPDIR``), so no other
Ray on the machine is seen or touched; its processes are killed by pid at the end (never ``ray stop``, which
stops every Ray of the user). A tiny train.py runs to its end beside it, then beside its leftover registration.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from examples.agent_envs.make_data import task_rows
from slime.utils.tiny_models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_under(folder: str) -> list:
    import ray  # noqa: F401 - Ray's bundled psutil

    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(folder in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill(procs) -> None:
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=10)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A live ``ray start --head`` in a temp folder of its own (short: Ray's socket paths must stay short)."""
    if not RAY.exists():
        pytest.skip("no ray command beside this Python")
    temp = tempfile.mkdtemp(prefix="rs")
    env = {**os.environ, "RAY_TMPDIR": temp}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([str(RAY), "start", "--head", f"--port={_free_port()}", "--num-cpus=1",
                          "--include-dashboard=false", "--disable-usage-stats"], env=env, capture_output=True,
                         text=True, timeout=180)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        address = (Path(temp) / "ray" / "ray_current_cluster").read_text().strip()
        root = tmp_path_factory.mktemp("beside")
        model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
        data = root / "tasks.jsonl"
        rows = task_rows("gridnav", 2, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=4)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        yield {"temp": temp, "env": env, "address": address, "model": str(model), "data": str(data), "root": root}
    finally:
        _kill(_processes_under(temp))
        shutil.rmtree(temp, ignore_errors=True)


def _train(head, name: str) -> subprocess.CompletedProcess:
    argv = ["--hf-checkpoint", head["model"], "--prompt-data", head["data"], "--rollout-batch-size", "1",
            "--n-samples-per-prompt", "1", "--num-rollout", "1", "--max-turns", "2", "--max-turn-response-len", "4",
            "--rollout-max-response-len", "64", "--rollout-interaction-env-path", "examples.agent_envs",
            "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", head["model"],
            "--metrics-dir", str(head["root"] / name)]
    return subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, env=head["env"], capture_output=True,
                          text=True, timeout=600)


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def test_a_live_ray_start_head_is_named_not_joined_and_the_run_ends(head):
    out = _train(head, "live")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    assert (f"train.py: starting a local Ray for this run (2 CPUs); the Ray cluster `ray start` runs at "
            f"{head['address']} is not joined (--ray-address {head['address']} joins it)") in lines, out.stderr
    assert lines[-1].startswith("train.py: done: 1 of 1 steps"), lines[-1]
    assert not any("Token authentication" in line for line in lines)  # Ray's WARNING about its own default
    assert _answers(head["address"])  # the user's cluster is left running


def test_a_stale_registration_is_ignored(head):
    _kill(_processes_under(head["temp"]))  # the head is gone; its registration stays
    assert (Path(head["temp"]) / "ray" / "ray_current_cluster").read_text().strip() == head["address"]
    assert not _answers(head["address"])
    out = _train(head, "stale")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "train.py: starting a local Ray for this run (2 CPUs)" in out.stderr.splitlines(), out.stderr
    assert out.stderr.splitlines()[-1].startswith("train.py: done: 1 of 1 steps")


def test_registered_cluster_answers_only_for_a_live_head(tmp_path, monkeypatch):
    from slime.ray.local_ray import registered_cluster

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert registered_cluster() is None  # nothing registered
    (tmp_path / "ray").mkdir()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        (tmp_path / "ray" / "ray_current_cluster").write_text(address + "\n")
        assert registered_cluster() == address
    assert registered_cluster() is None  # the same registration, nobody behind it
