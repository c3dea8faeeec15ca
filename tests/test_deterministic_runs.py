"""--enable-deterministic-inference: a request's result does not depend on what it was batched with, and
two runs of train.py with the same seeds but different request concurrency log the same figures, bit for bit.

Comparisons are exact (``==`` on the JSON replies and on metrics.jsonl), never a tolerance: float rounding
that depends on the batch is what made the demo's reruns part after 26 steps.
"""

from __future__ import annotations

import json

import pytest

from slime.backends.hf_engine.__main__ import parse_args as engine_args
from slime.backends.sglang_utils.launcher import build_engine_command
from slime.utils.arguments import parse_args
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

from _engine_helpers import gen, gen_many, run, start_hf_engine

from slime.utils import http_utils

NUMBERS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("det") / "m", hidden_size=32, num_layers=2, num_heads=2,
                                seed=5)


@pytest.fixture(scope="module")
def engines(ckpt):
    # The prefix cache is asked for: deterministic mode must turn it off (its hits depend on timing).
    det, _ = start_hf_engine(ckpt, deterministic=True, prefix_cache_bytes=1 << 24)
    fast, _ = start_hf_engine(ckpt, prefix_cache_bytes=1 << 24)
    yield det.url, fast.url
    det.stop()
    fast.stop()


def payloads():
    """Prompts of different lengths (so a shared batch pads), sampled, greedy, unseeded and score-only."""
    tok = build_tokenizer()
    out = []
    for i in range(6):
        ids = tok(f"task {i}: " + "go north, then east. " * (1 + i % 3))["input_ids"]
        sampling = {"max_new_tokens": 6 + i, "temperature": 0.0 if i == 4 else 1.0, "ignore_eos": True}
        if i != 3:
            sampling["sampling_seed"] = 100 + i
        out.append({"input_ids": ids, "sampling_params": sampling, "return_logprob": True,
                    "logprob_start_len": 0, "top_logprobs_num": 3})
    out.append({"input_ids": out[2]["input_ids"], "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2})
    return out


def essence(reply):
    meta = reply["meta_info"]
    return {"output_ids": reply["output_ids"], "finish_reason": meta["finish_reason"],
            **{k: meta.get(k) for k in NUMBERS}}


def layouts(url):
    """The same requests one at a time, as one batched /generate, and concurrently in reverse order."""
    reqs = payloads()
    single = [essence(gen(url, p)) for p in reqs]
    batched = {k: [p[k] for p in reqs] for k in ("input_ids", "sampling_params", "return_logprob",
                                                  "logprob_start_len", "top_logprobs_num")}
    together = [essence(r) for r in gen(url, batched)]
    reverse = [essence(r) for r in gen_many(url, reqs[::-1])][::-1]
    return single, together, reverse


def server_info(url):
    return run(http_utils.get(f"{url}/server_info", max_retries=1))


def test_results_are_bitwise_equal_across_batch_compositions(engines):
    single, together, reverse = layouts(engines[0])
    assert single == together == reverse
    assert all(len(r["output_ids"]) == 6 + i for i, r in enumerate(single[:6]))
    assert single[2]["input_token_logprobs"][1:] == single[6]["input_token_logprobs"][1:]


def test_throughput_mode_rounds_by_batch_so_the_comparison_is_sharp(engines):
    # Without the flag the same requests come back with other low bits once they share a padded batch:
    # the exact comparison above would catch an engine that still batched its forwards.
    single, together, _ = layouts(engines[1])
    numbers = lambda replies: [r[k] for r in replies for k in ("input_token_logprobs", "output_token_logprobs")]  # noqa: E731
    assert numbers(single) != numbers(together)


def test_server_info_reports_the_flag(engines):
    det, fast = server_info(engines[0]), server_info(engines[1])
    assert det["enable_deterministic_inference"] is True and det["disable_radix_cache"] is True
    assert fast["enable_deterministic_inference"] is False and fast["disable_radix_cache"] is False


def test_engines_get_the_flag_exactly_when_asked():
    assert engine_args(["--model-path", "m", "--enable-deterministic-inference"]).enable_deterministic_inference
    assert not engine_args(["--model-path", "m"]).enable_deterministic_inference
    for backend in ("hf_engine", "sglang"):
        base = ["--hf-checkpoint", "/models/m", "--rollout-backend", backend]
        # cpu=False: SGLang's GPU command (on a CPU SGLang refuses its deterministic mode: the test below)
        on = build_engine_command(parse_args(argv=base + ["--sglang-enable-deterministic-inference"]), port=1,
                                  cpu=False)
        off = build_engine_command(parse_args(argv=base), port=1, cpu=False)
        assert on.count("--enable-deterministic-inference") == 1
        assert "--enable-deterministic-inference" not in off


def test_sglang_on_a_cpu_refuses_deterministic_mode_before_starting():
    from slime.backends.sglang_utils.launcher import EngineLaunchError

    argv = ["--hf-checkpoint", "/models/m", "--rollout-backend", "sglang", "--sglang-enable-deterministic-inference"]
    with pytest.raises(EngineLaunchError, match="on a CPU"):
        build_engine_command(parse_args(argv=argv), port=1, cpu=True)


# ---------------------------------------------------------------------------- two train.py runs
def test_two_runs_with_different_concurrency_log_the_same_figures(tmp_path):
    import ray

    import train
    from examples.agent_envs.make_data import task_rows
    from slime.backends.sglang_utils.launcher import launch_engine
    from slime.utils.metrics import read_metrics

    student = save_tiny_checkpoint(tmp_path / "student", hidden_size=32, num_layers=2, num_heads=2, seed=0)
    teacher = save_tiny_checkpoint(tmp_path / "teacher", hidden_size=32, num_layers=2, num_heads=2, seed=1)
    data = tmp_path / "tasks.jsonl"
    rows = task_rows("gridnav", 6, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=5)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    flag = ["--sglang-enable-deterministic-inference"]
    server = launch_engine(parse_args(argv=["--hf-checkpoint", str(teacher), *flag]), log_dir=tmp_path / "logs")

    def one_run(name, concurrency):
        out = tmp_path / name
        argv = ["--hf-checkpoint", str(student), "--prompt-data", str(data), "--rollout-batch-size", "3",
                "--n-samples-per-prompt", "2", "--num-rollout", "3", "--rollout-max-response-len", "200",
                "--max-turn-response-len", "6", "--max-turns", "3", "--rollout-interaction-env-path",
                "examples.agent_envs", "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
                "--use-opd", "--opd-type", "sglang", "--rm-url", server.url + "/generate",
                "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards",
                "--lr", "1e-3", "--rollout-seed", "11", "--rollout-concurrency", str(concurrency),
                # The engine's own log-probs enter the loss, so its last bits reach every figure.
                "--use-rollout-logprobs",
                "--save", str(out), *flag]
        assert train.main(argv) == 0
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}
                for r in read_metrics(out / "metrics.jsonl")]

    try:
        # One request at a time (the engine decodes one row) against all six samples batched together.
        serial, concurrent = one_run("serial", 1), one_run("concurrent", 6)
    finally:
        server.stop()
        ray.shutdown()
    assert len(serial) == 3 and serial[0]["rollout/trained_tokens"] > 0
    differ = [(r["step"], k) for r, c in zip(serial, concurrent) for k in sorted(set(r) | set(c)) if r.get(k) != c.get(k)]
    assert not differ and serial == concurrent
