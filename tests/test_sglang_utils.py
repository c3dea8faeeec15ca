"""Engine launching: SGLang command line from the args, and a real hf_engine process started, health-waited,
updated and stopped."""

from __future__ import annotations

import asyncio
import sys

import pytest

from slime.backends.sglang_utils import (EngineLaunchError, EngineProcess, build_engine_command, find_free_port,
                                         launch_engine, update_weights_from_disk)
from slime.utils import http_utils
from slime.utils.arguments import parse_args
from slime.utils.tiny_models import save_tiny_checkpoint


def _args(*extra):
    return parse_args(argv=["--hf-checkpoint", "/models/qwen", *extra])


def test_sglang_command_from_args():
    args = _args("--rollout-backend", "sglang", "--rollout-num-gpus-per-engine", "4",
                 "--sglang-mem-fraction-static", "0.7", "--seed", "9", "--engine-host", "0.0.0.0")
    cmd = build_engine_command(args, port=30001, base_gpu_id=4)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::1], cmd[4::1]))
    assert flags["--model-path"] == "/models/qwen" and flags["--tp-size"] == "4"
    assert flags["--port"] == "30001" and flags["--host"] == "0.0.0.0"
    assert flags["--mem-fraction-static"] == "0.7" and flags["--random-seed"] == "9"
    assert flags["--base-gpu-id"] == "4"


def test_hf_engine_command_from_args():
    args = _args("--rollout-concurrency", "16")
    cmd = build_engine_command(args, model_path="/tmp/m", port=1234)
    assert cmd[1:3] == ["-m", "slime.backends.hf_engine"]
    flags = dict(zip(cmd[3::1], cmd[4::1]))
    assert flags["--model-path"] == "/tmp/m" and flags["--host"] == "127.0.0.1"
    assert flags["--max-batch-size"] == "16" and "--tp-size" not in flags
    assert "--disable-radix-cache" not in cmd  # the prefix cache is on unless asked otherwise


def test_trust_remote_code_is_opt_in():
    assert "--trust-remote-code" not in build_engine_command(_args("--rollout-backend", "sglang"), port=1)
    cmd = build_engine_command(_args("--rollout-backend", "sglang", "--trust-remote-code"), port=1)
    assert "--trust-remote-code" in cmd


@pytest.mark.parametrize("extra,trusted", [((), False), (("--trust-remote-code",), True)])
def test_trust_remote_code_reaches_the_agent_loop_tokenizer(monkeypatch, extra, trusted):
    import transformers

    from examples.multi_turn_tcod import rollout as multi_turn

    seen = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path, **kw: seen.append(kw["trust_remote_code"]) or object())
    monkeypatch.setattr(multi_turn, "_TOKENIZERS", {})
    multi_turn.get_tokenizer(_args(*extra))
    assert seen == [trusted]


@pytest.mark.parametrize("backend", ["hf_engine", "sglang"])
def test_disable_radix_cache_reaches_both_engines(backend):
    args = _args("--rollout-backend", backend, "--sglang-disable-radix-cache")
    assert "--disable-radix-cache" in build_engine_command(args, model_path="/tmp/m", port=1234)


def test_launch_generate_update_and_stop(tmp_path):
    a = save_tiny_checkpoint(tmp_path / "a", seed=0)
    b = save_tiny_checkpoint(tmp_path / "b", seed=1)
    args = _args()
    payload = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
               "logprob_start_len": 0}
    engine = launch_engine(args, model_path=str(a), log_dir=tmp_path / "logs", timeout=120)
    try:
        assert engine.url.startswith("http://127.0.0.1:")
        first = http_utils.post_sync(f"{engine.url}/generate", payload)
        reply = asyncio.run(_update(f"{engine.url}/generate", str(b)))
        assert reply["success"] is True
        second = http_utils.post_sync(f"{engine.url}/generate", payload)
        assert first["meta_info"]["input_token_logprobs"] != second["meta_info"]["input_token_logprobs"]
        with pytest.raises(RuntimeError, match="model_path"):
            asyncio.run(_update(engine.url, str(tmp_path / "missing")))
    finally:
        code = engine.stop()
    assert code is not None and engine.process.poll() is not None


async def _update(url, path):
    try:
        return await update_weights_from_disk(url, path, max_retries=1)
    finally:
        await http_utils.close_session()


def test_server_that_dies_reports_its_log(tmp_path):
    script = "import sys; print('cannot load model: no_model_here', flush=True); sys.exit(3)"
    engine = EngineProcess([sys.executable, "-c", script], host="127.0.0.1", port=find_free_port(),
                           log_path=tmp_path / "dead.log")
    with pytest.raises(EngineLaunchError) as err:
        engine.wait_healthy(timeout=60, poll=0.1)
    message = str(err.value)
    assert "exited with code 3" in message and "cannot load model: no_model_here" in message


def test_server_that_never_gets_healthy_is_stopped(tmp_path):
    port = find_free_port()
    script = "import sys, time; print('still loading', flush=True); time.sleep(120)"
    engine = EngineProcess([sys.executable, "-c", script], host="127.0.0.1", port=port,
                           log_path=tmp_path / "slow.log")
    with pytest.raises(EngineLaunchError, match="not healthy after 1s") as err:
        engine.wait_healthy(timeout=1.0, poll=0.1)
    assert "still loading" in str(err.value)
    assert engine.process.poll() is not None  # terminated, not left behind
