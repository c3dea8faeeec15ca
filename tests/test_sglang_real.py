"""Real SGLang 0.5.15.post1 on this CPU, started by this runtime's launcher (``--rollout-backend sglang
--sglang-python``), and sglang-router in front of it: the code a GPU user runs first, run here.

One student and one teacher server are shared by every test of this module (an SGLang server takes about a
minute to start on two cores); a test that changes an engine's weights puts them back before it ends, so the
tests stay independent. They are launched through ``launch_engine`` with the CPU settings the launcher adds:
without those settings SGLang does not start here and every test of this module fails. The SGLang environment
is the one ``python -m slime.backends.sglang_utils.sglang_env`` builds (``make test`` builds it first; here it is
built if missing).

The protocol facts that were first read from SGLang's code with the forward emulated (REFERENCE.md section 8)
are each checked against the live server: an over-long request is a 400; ``sampling_seed`` is ignored without
``--enable-deterministic-inference``, which SGLang refuses on a CPU; ``/get_model_info`` has no ``vocab_size`` (the
teacher's vocabulary is probed through ``/generate``); weight updates reach every engine behind the router.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from slime.backends.sglang_utils import engine_info, sglang_env
from slime.backends.sglang_utils.launcher import EngineProcess, build_engine_command, find_free_port
from slime.backends.sglang_utils.processes import pid_alive
from slime.backends.sglang_utils.router import SGLangRouter
from slime.backends.sglang_utils.weights import abort_all_requests, update_weights_from_disk
from slime.utils import http_utils
from slime.utils.arguments import get_parser
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

# A real SGLang server starts in 50-94 s on two quiet cores, several minutes on a loaded machine; the module's
# first test and the train.py fixture include those starts.
pytestmark = pytest.mark.timeout(1800)
CONTEXT = 384
PROMPT = list(range(5, 37))  # 32 token ids of the tiny tokenizer


def _args(python, *extra):
    return get_parser().parse_args(["--rollout-backend", "sglang", "--sglang-python", python,
                                    "--rollout-max-context-len", str(CONTEXT), "--seed", "7", *extra])


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    """The student and the teacher as real SGLang servers, started side by side by the runtime's launcher."""
    python = str(sglang_env.build())
    root = tmp_path_factory.mktemp("sglang_real")
    models = {name: str(save_tiny_checkpoint(root / name, hidden_size=32, num_layers=2, num_heads=2, seed=seed))
              for name, seed in (("student", 0), ("teacher", 1), ("student_b", 2))}
    servers = {}
    try:
        for name in ("student", "teacher"):
            port = find_free_port()
            cmd = build_engine_command(_args(python), model_path=models[name], host="127.0.0.1", port=port)
            servers[name] = EngineProcess(cmd, host="127.0.0.1", port=port, log_path=root / f"{name}.log")
        for server in servers.values():  # they load side by side
            server.wait_healthy(timeout=600)
        yield {"python": python, "root": root, "models": models, **servers}
    finally:
        for server in servers.values():
            server.stop()


def _run(coro_fn):
    async def run():
        try:
            return await coro_fn()
        finally:
            await http_utils.close_session()

    return asyncio.run(run())


def _generate(url, payload, **kw):
    return _run(lambda: http_utils.post(f"{url}/generate", payload, max_retries=1, **kw))


def _greedy(url, n=12):
    return _generate(url, {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                                     "ignore_eos": True}})["output_ids"]


def _load(url, path):
    return _run(lambda: update_weights_from_disk(url, path, max_retries=1))


def test_servers_run_on_the_cpu_under_the_watchdog(sglang):
    info = _run(lambda: engine_info.get_server_info(sglang["student"].url))
    assert info["device"] == "cpu" and info["attention_backend"] == "torch_native"
    assert info["context_length"] == CONTEXT and info["dtype"] == "float32"
    # SGLang's processes are the server's group: the watchdog can take all of them down.
    pgid = os.getpgid(sglang["student"].process.pid)
    assert pgid == sglang["student"].process.pid
    assert "child_watchdog.py" in " ".join(sglang["student"].cmd)


def test_weights_from_disk_change_the_engine_output_and_back(sglang):
    student, teacher = sglang["student"].url, sglang["teacher"].url
    own = _greedy(student)
    assert own != _greedy(teacher)
    try:
        reply = _load(student, sglang["models"]["teacher"])
        assert reply["success"] is True
        assert _greedy(student) == _greedy(teacher)  # the teacher's weights, served by the student engine
    finally:
        _load(student, sglang["models"]["student"])
    assert _greedy(student) == own
    with pytest.raises(RuntimeError, match="did not load weights|HTTP 400"):
        _load(student, str(sglang["root"] / "missing"))
    assert _greedy(student) == own  # a failed load leaves the weights as they were


def test_a_request_longer_than_the_context_is_a_400(sglang):
    url = sglang["student"].url
    limits = _run(lambda: engine_info.read_limits(url))
    assert limits.context_len == CONTEXT and limits.max_prompt_len < CONTEXT
    fits = len(PROMPT) * 2
    ok = _generate(url, {"input_ids": PROMPT * 2, "sampling_params": {"max_new_tokens": CONTEXT - fits}})
    assert ok["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    with pytest.raises(http_utils.HTTPRequestError) as err:
        _generate(url, {"input_ids": PROMPT * 2, "sampling_params": {"max_new_tokens": CONTEXT - fits + 1}})
    assert err.value.status == 400
    with pytest.raises(http_utils.HTTPRequestError) as err:
        _generate(url, {"input_ids": PROMPT * 12, "sampling_params": {"max_new_tokens": 1}})
    assert err.value.status == 400


def _sampled(url, seed):
    return _generate(url, {"input_ids": PROMPT, "sampling_params": {"temperature": 1.0, "max_new_tokens": 24,
                                                                     "ignore_eos": True, "sampling_seed": seed}})[
        "output_ids"]


def test_sampling_seed_is_ignored_without_deterministic_inference(sglang):
    # SGLang uses sampling_seed only under --enable-deterministic-inference, which it refuses on a CPU (the
    # launcher says so before starting anything: test_deterministic_inference_is_refused_on_a_cpu): here the same
    # seed does not repeat a sample. The runtime reads the mode from /server_info and warns (engine_info).
    url = sglang["student"].url
    assert len({tuple(_sampled(url, 1)) for _ in range(3)}) > 1
    limits = _run(lambda: engine_info.read_limits(url))
    assert limits.deterministic is False


def test_deterministic_inference_is_refused_on_a_cpu(sglang):
    from slime.backends.sglang_utils.launcher import EngineLaunchError

    args = _args(sglang["python"], "--sglang-enable-deterministic-inference")
    with pytest.raises(EngineLaunchError, match="deterministic"):
        build_engine_command(args, model_path=sglang["models"]["student"], port=find_free_port(), cpu=True)
    # On a GPU the flag is passed on as before.
    assert "--enable-deterministic-inference" in build_engine_command(args, port=1, cpu=False)


def test_teacher_vocabulary_is_probed_without_vocab_size(sglang):
    from slime.backends.teacher_vocab import probe_teacher

    info = _run(lambda: http_utils.get(f"{sglang['teacher'].url}/get_model_info", max_retries=1))
    assert "vocab_size" not in info and "model_vocab_size" not in info
    tokenizer = build_tokenizer()
    size = len(tokenizer)
    base = sglang["teacher"].url
    assert _run(lambda: probe_teacher(base, tokenizer, size, check_size=True, check_tokens=True)) is True
    # A student whose output layer is one row wider or narrower than the teacher's is refused by the probe.
    for other in (size + 1, size - 1):
        with pytest.raises(ValueError, match="model vocabulary"):
            _run(lambda: probe_teacher(base, tokenizer, other, check_size=True, check_tokens=False))


def test_weights_flushes_and_aborts_reach_every_engine_behind_sglang_router(sglang):
    student, teacher = sglang["student"].url, sglang["teacher"].url
    router = SGLangRouter([student, teacher], log_dir=sglang["root"]).start()
    own = {student: _greedy(student), teacher: _greedy(teacher)}
    try:
        assert sorted(_run(lambda: engine_info.router_workers(router.url))) == sorted([student, teacher])
        # sglang-router does not route a weight update: the runtime sends it to every worker the router lists.
        with pytest.raises(http_utils.HTTPRequestError) as err:
            _load(router.url, sglang["models"]["student_b"])
        assert err.value.status == 404

        async def push():
            urls = await engine_info.router_workers(router.url)
            await asyncio.gather(*(update_weights_from_disk(u, sglang["models"]["student_b"], max_retries=1)
                                   for u in urls))

        _run(push)
        assert _greedy(student) == _greedy(teacher) != own[student]
        # A generation through the router is served by one of them, now on the new weights.
        assert _greedy(router.url) == _greedy(student)
        # The cache flush is routed to every worker.
        flushed = _run(lambda: http_utils.post(f"{router.url}/flush_cache", None, max_retries=1))
        assert flushed["workers_flushed"] == 2
        # Aborts: a long generation on each engine ends with finish_reason abort.

        async def abort_during():
            long = {"input_ids": PROMPT, "sampling_params": {"temperature": 1.0, "max_new_tokens": 300,
                                                             "ignore_eos": True}}
            running = [asyncio.ensure_future(http_utils.post(f"{u}/generate", long, max_retries=1))
                       for u in (student, teacher)]
            await asyncio.sleep(1.0)
            await abort_all_requests(await engine_info.router_workers(router.url), max_retries=1)
            return await asyncio.gather(*running)

        for reply in _run(abort_during):
            assert reply["meta_info"]["finish_reason"]["type"] == "abort"
            assert len(reply["output_ids"]) < 300
    finally:
        router.stop()
        _load(student, sglang["models"]["student"])
        _load(teacher, sglang["models"]["teacher"])
    assert _greedy(student) == own[student] and _greedy(teacher) == own[teacher]
    assert router.process.poll() is not None


# ---------------------------------------------------------------------------- train.py on real SGLang
SERVER_TEACHER = ["--use-opd", "--opd-type", "sglang",
                  "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                  "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards"]
GAP = "train/train_rollout_logprob_abs_diff"


def _sglang_processes(marker: str) -> list[int]:
    """Pids of SGLang processes whose command line names ``marker`` (a model folder of one run)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and "sglang" in cmdline and pid_alive(int(entry)):
                found.append(int(entry))
    return found


def _train(sglang, out, *extra, steps):
    import train
    from examples.agent_envs.make_data import task_rows
    from slime.utils.metrics import read_metrics

    data = sglang["root"] / "tasks.jsonl"
    if not data.exists():
        rows = task_rows("gridnav", 8, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=5)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--hf-checkpoint", sglang["models"]["train_student"], "--prompt-data", str(data),
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "1", "--num-rollout", str(steps),
            "--rollout-max-response-len", "200", "--max-turn-response-len", "6", "--max-turns", "4",
            "--rollout-interaction-env-path", "examples.agent_envs",
            "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
            "--rollout-temperature", "1.0", "--lr", "1e-2", "--save", str(out), "--save-interval", "2",
            "--rollout-seed", "3", "--rm-url", sglang["teacher"].url + "/generate", *SERVER_TEACHER, *extra]
    assert train.main(argv) == 0
    return read_metrics(out / "metrics.jsonl")


@pytest.fixture(scope="module")
def trained(sglang):
    """train.py, tiny multi-turn OPD for 2 steps: the student engine is an SGLang server train.py starts itself
    (``--rollout-backend sglang --sglang-python``), the teacher is the module's SGLang teacher."""
    sglang["models"]["train_student"] = str(save_tiny_checkpoint(sglang["root"] / "train_student", hidden_size=32,
                                                                 num_layers=2, num_heads=2, seed=3))
    out = sglang["root"] / "run"
    records = _train(sglang, out, "--rollout-backend", "sglang", "--sglang-python", sglang["python"], steps=2)
    return {"out": out, "records": records}


def test_train_py_runs_opd_on_sglang_engines_it_starts(sglang, trained):
    records = trained["records"]
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["rollout/trained_tokens"] > 0 and r["opd/reverse_kl"] != 0  # the teacher scored the episodes
        # The engine's log-probs of the sampled tokens are the trainer's own (fp32 on both sides): at step 1 only
        # if the weights trained at step 0 reached the engine (stale weights differ by the update: > 1e-3).
        assert r[GAP] < 1e-3, r[GAP]
    assert records[0]["loss"] != records[1]["loss"]
    # The run's engine went with it: no SGLang process of this run is left.
    assert _sglang_processes(sglang["models"]["train_student"]) == []


def test_train_py_resumes_through_sglang_router(sglang, trained):
    """The resumed run starts no engine: its rollouts go through an sglang-router in front of the module's
    student engine, which first gets the checkpoint's weights (it served another model until then)."""
    student = sglang["student"].url
    router = SGLangRouter([student], log_dir=sglang["root"]).start()
    try:
        host, port = router.url.rsplit("//", 1)[1].split(":")
        records = _train(sglang, trained["out"], "--load", str(trained["out"]), "--sglang-router-ip", host,
                         "--sglang-router-port", port, steps=3)
    finally:
        router.stop()
        _load(student, sglang["models"]["student"])
    assert [r["step"] for r in records] == [0, 1, 2]
    resumed = records[-1]
    assert resumed[GAP] < 1e-3, resumed[GAP]  # the engine served the checkpoint's weights, then step 2's
    assert resumed["rollout/trained_tokens"] > 0
