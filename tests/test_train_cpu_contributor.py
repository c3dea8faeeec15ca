"""train_cpu.py for a slime contributor: the log named at the start and a heartbeat while train.py runs, their own
flags (--extra-args), every step at full precision (steps.jsonl, --compare), and no process left behind (the reaper).
slime's train.py itself is not run here: a stand-in "python" prints what slime's would."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.slime_pr import train_cpu, train_cpu_reaper, train_cpu_run  # noqa: E402


def _slime_tree(root: Path) -> Path:
    (root / "slime/utils").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "slime/utils/arguments.py").write_text("")
    return root


def _fake_python(tmp_path: Path, loss: float) -> Path:
    """A stand-in for the harness venv's python: echoes its argv, prints two of slime's step lines, slowly."""
    script = tmp_path / "fake_python"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, time
        print("argv", sys.argv[1:], flush=True)
        time.sleep(0.5)
        print("model.py:918 - step 0: {{'train/loss': {loss!r}, 'train/grad_norm': 1.5}}", flush=True)
        time.sleep(0.5)
        print("model.py:918 - step 1: {{'train/loss': {loss * 2!r}, 'train/grad_norm': 0.75}}", flush=True)
        """))
    script.chmod(0o755)
    return script


def _case_running_train(args, env):
    run = train_cpu_run.run_train(args, env, train_cpu_run.Run("only", ["--case-flag", "1"], args.out / "train.log"), 2)
    train_cpu_run.require_ok(run)
    return "stand-in"


def _main(tmp_path, monkeypatch, loss, *extra):
    tree = tmp_path / "slime"
    if not tree.exists():
        _slime_tree(tree)
    fake = _fake_python(tmp_path, loss)
    monkeypatch.setattr(train_cpu_run, "HEARTBEAT_S", 0.2)
    monkeypatch.setitem(train_cpu.CASE_FUNCS, "pristine-grpo", _case_running_train)
    monkeypatch.setattr(train_cpu, "harness_env", lambda args: {**os.environ, "TRAIN_CPU_PYTHON": str(fake)})
    out = tmp_path / f"out-{loss}"
    return train_cpu.main([str(tree), "--case", "pristine-grpo", "--out", str(out), *extra]), out


def test_the_log_is_named_first_a_heartbeat_follows_and_extra_args_come_last(tmp_path, monkeypatch, capsys):
    rc, out = _main(tmp_path, monkeypatch, 0.5, "--extra-args", "--lr 2e-5 --eps-clip 0.1")
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0, lines[-1]
    starts = [i for i, ln in enumerate(lines) if "starts; its log: " + str(out / "train.log") in ln]
    beats = [i for i, ln in enumerate(lines) if "running" in ln and "train.py (only)" in ln]
    assert starts and beats and starts[0] < beats[0]
    assert any("latest step 0:" in lines[i] for i in beats)  # the heartbeat carries the newest step line
    argv = (out / "train.log").read_text().splitlines()[2]
    assert argv.endswith("'--case-flag', '1', '--lr', '2e-5', '--eps-clip', '0.1']")  # theirs after the case's


def test_losses_are_printed_and_kept_at_full_precision(tmp_path, monkeypatch, capsys):
    rc, out = _main(tmp_path, monkeypatch, 0.123456789012)
    last = capsys.readouterr().out.splitlines()[-1]
    assert rc == 0 and "0.123456789012" in last and "0.246913578024" in last
    assert "; no engine (saved rollouts);" in last  # pristine-grpo trains on saved rollouts: --engine is moot
    steps = [json.loads(ln) for ln in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["train/loss"] for s in steps] == [0.123456789012, 0.246913578024]
    assert [s["_step"] for s in steps] == [0, 1]


def test_compare_shows_a_loss_changed_by_a_ten_thousandth(tmp_path, monkeypatch, capsys):
    _, earlier = _main(tmp_path, monkeypatch, 0.5)
    capsys.readouterr()
    rc, _ = _main(tmp_path, monkeypatch, 0.5 * 1.0001, "--compare", str(earlier))
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    loss0 = [ln for ln in lines if "step 0 train/loss" in ln]
    assert loss0 and "diff +5e-05" in loss0[0]
    assert any("step 0 train/grad_norm" in ln and "(same)" in ln for ln in lines)
    assert lines[-1].startswith("train_cpu pristine-grpo: ok")  # the result stays the last line


def test_compare_and_extra_args_refuse_bad_input_in_one_line(tmp_path):
    tree = _slime_tree(tmp_path / "slime")
    with pytest.raises(SystemExit):
        train_cpu.parse_args([str(tree), "--case", "pristine-grpo", "--compare", str(tmp_path)])
    with pytest.raises(SystemExit):
        train_cpu.parse_args([str(tree), "--case", "pristine-grpo", "--extra-args", "--lr 'unclosed"])


def _spawn_holder(token: str) -> subprocess.Popen:
    env = {**os.environ, train_cpu_reaper.ENV_KEY: token}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)


def test_sweep_ends_every_process_that_holds_the_token_and_no_other():
    token = train_cpu_reaper.new_token()
    mine, other = _spawn_holder(token), _spawn_holder(train_cpu_reaper.new_token())
    try:
        time.sleep(0.3)
        assert train_cpu_reaper.holders(token) == [mine.pid]
        assert train_cpu_reaper.sweep(token, grace_s=5) == [mine.pid]
        assert mine.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_the_watchdog_sweeps_when_the_harness_is_killed(tmp_path):
    """A harness killed with SIGKILL (no finally runs): its watchdog still ends the server it had started."""
    token = train_cpu_reaper.new_token()
    pidfile = tmp_path / "server.pid"
    harness = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import os, subprocess, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tools.slime_pr import train_cpu_reaper as r
        os.environ[r.ENV_KEY] = {token!r}
        w = r.start_watchdog({token!r})
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open({str(pidfile)!r}, "w").write(str(server.pid))
        time.sleep(120)
        """)])
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        server = int(pidfile.read_text())
        assert train_cpu_reaper.holders(token)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        deadline = time.monotonic() + 30
        while train_cpu_reaper.holders(token):
            assert time.monotonic() < deadline, "the watchdog did not end the server"
            time.sleep(0.2)
        assert not Path(f"/proc/{server}").exists() or "Z" in Path(f"/proc/{server}/stat").read_text().split()[2]
    finally:
        harness.kill()
        for pid in train_cpu_reaper.holders(token):
            os.kill(pid, signal.SIGKILL)


def test_main_sweeps_what_a_case_left_running(tmp_path, monkeypatch, capsys):
    tree = _slime_tree(tmp_path / "slime")
    left = {}

    def leaves_a_server(args, env):
        # inherits the case's token from os.environ, as every engine and Ray process does
        left["p"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        return "fine"

    monkeypatch.setitem(train_cpu.CASE_FUNCS, "pristine-grpo", leaves_a_server)
    monkeypatch.setattr(train_cpu, "harness_env", lambda args: {})
    assert train_cpu.main([str(tree), "--case", "pristine-grpo", "--out", str(tmp_path / "o")]) == 0
    assert left["p"].wait(timeout=15) == -signal.SIGTERM
    assert "ended 1 process(es)" in capsys.readouterr().out
    assert train_cpu_reaper.ENV_KEY not in os.environ


def test_a_failed_run_quotes_what_the_engines_logged(tmp_path):
    """An engine refuses a request with an HTTP 500 and logs why; the case's one line carries the engine's reason."""
    log, engine_log = tmp_path / "train.log", tmp_path / "sglang_student0.log"
    log.write_text("httpx.HTTPStatusError: Server error '500 Internal Server Error' for url 'http://r/generate'\n")
    engine_log.write_text("Traceback (most recent call last):\n  File x\n"
                          "TypeError: Unexpected keyword argument 'stop_on_goal'\nINFO: next\n")
    run = train_cpu_run.Run("first", [], log, rc=1, seconds=3.0)
    with pytest.raises(train_cpu_run.CaseFailed) as exc:
        train_cpu_run.require_ok(run, {"sglang student0": engine_log})
    assert "the engines logged: sglang student0: TypeError: Unexpected keyword argument 'stop_on_goal'" in str(
        exc.value)
    with pytest.raises(train_cpu_run.CaseFailed) as exc:
        train_cpu_run.require_ok(run)
    assert "engines logged" not in str(exc.value)


def test_a_refused_request_quotes_the_engines_answer(tmp_path):
    """A 400 reaches train.py's last line only as httpx's status; the reason is in the body slime's retries logged
    (as SGLang 0.5.15.post1 answered a top_p of 1.5 through sglang-router, 2026-12-07)."""
    log = tmp_path / "train.log"
    log.write_text(
        "(RolloutManager pid=1) ... Status/400, retrying... (attempt 60/60, url=http://127.0.0.1:4109/generate, "
        'response={"error":{"message":"top_p must be in (0, 1], got 1.5."}})\n'
        "httpx.HTTPStatusError: Client error '400 Bad Request' for url 'http://127.0.0.1:4109/generate'\n")
    run = train_cpu_run.Run("first", [], log, rc=1, seconds=3.0)
    with pytest.raises(train_cpu_run.CaseFailed) as exc:
        train_cpu_run.require_ok(run)
    assert "http://127.0.0.1:4109/generate answered: top_p must be in (0, 1], got 1.5." in str(exc.value)
    log.write_text("httpx.HTTPStatusError: Client error '400 Bad Request' for url 'http://r/generate'\n")
    with pytest.raises(train_cpu_run.CaseFailed) as exc:
        train_cpu_run.require_ok(run)
    assert "answered" not in str(exc.value)
