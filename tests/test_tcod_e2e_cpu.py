"""CPU end-to-end TCOD test: F2B and B2F through slime's own rollout, training-data and advantage code.

Faked are only the edges: student and teacher ``/generate`` servers on loopback (log-probs from two seeded
tiny bigram models), a character-level tokenizer, and the sglang / Megatron modules. The stubs live in a
fixture: slime's modules are imported against them there and dropped again afterwards, so other tests in
the same process see ``sys.modules`` as it was, whether sglang or Megatron is installed or not. A fixture that
fails on a missing ``sglang.*`` or ``megatron.*`` name means slime imports something new from them: add it to STUBS.
"""

import argparse
import base64
import importlib
import itertools
import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml
from aiohttp import web

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `examples` is not an installed package
    sys.path.insert(0, str(REPO_ROOT))

from test_tcod_rollout import qwen3_like_tokenizer  # noqa: E402 - tests/ is on sys.path, as for every test

NUM_GPUS = 0
pytestmark = pytest.mark.unit


def _megatron_parse_args(extra_args_provider=None, ignore_unknown_args=False):
    """Megatron-LM's ``parse_args`` reduced to the flags slime's argument code reads, plus slime's own groups."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--fp16", action="store_true")
    for flag in ("--seq-length", "--max-position-embeddings", "--vocab-size", "--num-layers", "--moe-router-topk"):
        parser.add_argument(flag, type=int, default=None)
    for flag in ("--tokenizer-model", "--tokenizer-type"):
        parser.add_argument(flag, type=str, default=None)
    return extra_args_provider(parser).parse_known_args()[0]


def _add_sglang_server_args(parser):
    """SGLang's ``ServerArgs.add_cli_args``, reduced to the flags slime reads (registered as ``--sglang-*``)."""
    for flag in ("--dp-size", "--pp-size", "--ep-size", "--moe-dp-size"):
        parser.add_argument(flag, type=int, default=1)


SINGLE_RANK_MPU = types.SimpleNamespace(
    is_pipeline_last_stage=lambda *args, **kwargs: True,
    get_context_parallel_rank=lambda: 0,
    get_context_parallel_world_size=lambda: 1,
)
STUBS = {
    "sglang": {},
    "sglang.srt": {},
    "sglang.srt.constants": dict.fromkeys(
        ("GPU_MEMORY_TYPE_CUDA_GRAPH", "GPU_MEMORY_TYPE_KV_CACHE", "GPU_MEMORY_TYPE_WEIGHTS"), "unused"
    ),
    "sglang.srt.server_args": {"ServerArgs": types.SimpleNamespace(add_cli_args=_add_sglang_server_args)},
    "sglang.srt.utils": {"kill_process_tree": lambda *args, **kwargs: None},
    "sglang_router": {},
    "sglang_router.launch_router": {"RouterArgs": types.SimpleNamespace(add_cli_args=lambda *a, **k: None)},
    "megatron": {},
    "megatron.core": {"mpu": SINGLE_RANK_MPU},
    "megatron.training": {},
    "megatron.training.arguments": {"parse_args": _megatron_parse_args, "validate_args": lambda args: args},
    "megatron.training.tokenizer": {},
    "megatron.training.tokenizer.tokenizer": {"_vocab_size_with_padding": lambda vocab_size, args: vocab_size},
}
FRESH = ("slime", "examples", "sglang", "sglang_router", "megatron")  # imported anew against the stubs
MODULES = {  # what the tests use, imported in the fixture
    "make_data": "examples.multi_turn_tcod.envs.make_data",
    "aiohttp_threaded": "slime.agent.aiohttp_threaded",
    "loss": "slime.backends.megatron_utils.loss",
    "rollout_data_utils": "slime.observability.rollout_data_utils",
    "ray_rollout": "slime.ray.rollout",
    "sample_hooks": "slime.rollout.sample_hooks",
    "sglang_rollout": "slime.rollout.sglang_rollout",
    "arguments": "slime.utils.arguments",
    "http_utils": "slime.utils.http_utils",
    "misc": "slime.utils.misc",
}


def _fresh_modules():
    return [name for name in sys.modules if name.split(".")[0] in FRESH]


@pytest.fixture(scope="module")
def slime_code():
    """slime's modules this test drives, imported against the stubs; all of them leave ``sys.modules`` after."""
    with pytest.MonkeyPatch.context() as mp:
        # Another test's transformers stub goes too: the tokenizer here is real.
        stubbed = "transformers" in sys.modules and getattr(sys.modules["transformers"], "__file__", None) is None
        for name in _fresh_modules() + [m for m in sys.modules if stubbed and m.split(".")[0] == "transformers"]:
            mp.delitem(sys.modules, name)
        for name, attrs in STUBS.items():
            module = types.ModuleType(name)
            vars(module).update(attrs)
            mp.setitem(sys.modules, name, module)
        try:
            yield types.SimpleNamespace(**{name: importlib.import_module(path) for name, path in MODULES.items()})
        finally:
            for name in _fresh_modules():
                sys.modules.pop(name, None)  # the context then restores what was there before


GRIDNAV = "examples.multi_turn_tcod.envs.gridnav"
# An environment that cannot start for the tasks marked "broken": their episodes end before any student turn.
FAILING_ENV = """
from examples.multi_turn_tcod.envs.gridnav import build_env as build_gridnav


def build_env(sample, args):
    if sample.metadata.get("broken"):
        raise RuntimeError("the simulator did not start")
    return build_gridnav(sample, args)
"""
LAYERS, TOPK = 2, 2
ROLLOUT_IDS = range(5)  # --tcod-eta 1: depth k(n) = n + 1 grows past every expert length (3 or 4)
OPD_KL_COEF = 0.5
POSITION = re.compile(r"at (\d+),(\d+) goal (\d+),(\d+)")
STUDENT_TURN = re.compile(r"<think>\n[^<]+\n</think>\n\n(up|down|left|right)<\|im_end\|>")
REPLAYED_TURN = re.compile(r"(?:^|<\|im_start\|>assistant\n)(up|down|left|right)<\|im_end\|>")


class TinyLM:
    """A seeded bigram model with a position embedding: ``log p(ids[t] | ids[t-1], t)``, so a shift shows."""

    def __init__(self, vocab_size: int, seed: int, dim: int = 8, max_len: int = 8192):
        generator = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab_size, dim, generator=generator)
        self.position = torch.randn(max_len, dim, generator=generator)
        self.head = torch.randn(dim, vocab_size, generator=generator)

    def token_logprobs(self, ids: list[int]) -> list[float]:
        """The log-prob of each of ``ids[1:]`` given what precedes it."""
        ids = torch.tensor(ids)
        logits = (self.embed[ids[:-1]] + self.position[1 : len(ids)]) @ self.head
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[1:, None]).squeeze(-1).tolist()


def qwen3_reply(context: str) -> str:
    """A thinking reply that steps toward the goal of the last observation (the grids have no walls)."""
    x, y, goal_x, goal_y = map(int, POSITION.findall(context)[-1])
    move = "right" if goal_x > x else "left" if goal_x < x else "down" if goal_y > y else "up"
    return f"<think>\nThe goal is {goal_x - x} across and {goal_y - y} down, so one step {move}.\n</think>\n\n{move}"


def routed_rows(ids: list[int]) -> list:
    """The engine's routing of ``ids``: (tokens - 1, layers, top-k), experts 1..7 as a function of the token."""
    return [[[1 + (t + k) % 7 for k in range(TOPK)]] * LAYERS for t in ids[:-1]]


def routing(ids: list[int]) -> str:
    return base64.b64encode(torch.tensor(routed_rows(ids), dtype=torch.int32).numpy().tobytes()).decode()  # as SGLang


class FakeSGLang:
    """SGLang's native HTTP API on loopback: the student replies, the teacher scores the whole trajectory."""

    def __init__(self, run_app_in_thread, tokenizer, model: TinyLM, student: bool):
        self.tokenizer, self.model, self.student, self.requests = tokenizer, model, student, []
        self.stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/workers", self.workers)  # what abort() asks after a rollout
        app.router.add_post("/abort_request", self.idle)
        app.router.add_get("/v1/loads", self.idle)
        self.handle = run_app_in_thread(app, host="127.0.0.1", port=0, thread_name="fake-sglang")
        self.url = f"http://127.0.0.1:{self.handle.port}"

    async def workers(self, request):
        return web.json_response({"workers": [{"url": self.url}]})

    async def idle(self, request):
        return web.json_response({"num_reqs": 0})

    async def generate(self, request):
        payload = await request.json()
        self.requests.append(dict(payload, routing_key=request.headers.get("X-SMG-Routing-Key")))
        ids = payload["input_ids"]
        if not self.student:  # the OPD reward_func: max_new_tokens 0, logprob_start_len 0
            entries = [[None, ids[0], None]] + [
                [lp, i, None] for lp, i in zip(self.model.token_logprobs(ids), ids[1:], strict=True)
            ]
            meta = {"input_token_logprobs": entries, "output_token_logprobs": [], "finish_reason": {"type": "length"}}
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        if not payload["sampling_params"]["max_new_tokens"]:  # a prefill-only request for its routing
            meta = {"routed_experts": routing(ids), "finish_reason": {"type": "length"}, "output_token_logprobs": []}
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        reply = self.tokenizer.encode(qwen3_reply(self.tokenizer.decode(ids)), add_special_tokens=False)
        reply = (reply + [self.stop_id])[: payload["sampling_params"]["max_new_tokens"]]
        log_probs = self.model.token_logprobs(ids + reply)[len(ids) - 1 :]
        finish = {"type": "stop", "matched": self.stop_id} if reply[-1] == self.stop_id else {"type": "length"}
        meta = {"output_token_logprobs": [[lp, i, None] for lp, i in zip(log_probs, reply, strict=True)]}
        meta |= {"finish_reason": finish, "prompt_tokens": len(ids), "completion_tokens": len(reply)}
        if payload["sampling_params"].get("custom_params", {}).get("return_top_p_token_ids"):  # --rollout-top-p < 1
            meta |= {"top_p_token_ids": reply, "top_p_token_offsets": list(range(len(reply) + 1))}
        if payload.get("return_routed_experts"):
            meta["routed_experts"] = routing(ids + reply)
        return web.json_response({"text": self.tokenizer.decode(reply), "output_ids": reply, "meta_info": meta})


@pytest.fixture(scope="module")
def hf_checkpoint(slime_code, tmp_path_factory):
    """test_tcod_rollout.py's Qwen3-like tokenizer, saved for slime's ``load_tokenizer(args.hf_checkpoint)``."""
    tokenizer = qwen3_like_tokenizer()
    path = tmp_path_factory.mktemp("hf_checkpoint")
    tokenizer.save_pretrained(path)
    return path, tokenizer


@pytest.fixture(scope="module")
def servers(slime_code, hf_checkpoint):
    """The student and the teacher: (student, teacher)."""
    _, tokenizer = hf_checkpoint
    run = slime_code.aiohttp_threaded.run_app_in_thread
    pair = [FakeSGLang(run, tokenizer, TinyLM(len(tokenizer), seed=1 + i), student=i == 0) for i in range(2)]
    yield pair
    for server in pair:
        server.handle.stop()


@pytest.fixture
def manager(slime_code, monkeypatch, tmp_path, hf_checkpoint, servers):
    """``manager(mode, top_p=1.0, env=GRIDNAV, extra="")``: a RolloutManagerState on the args slime parses from a
    launch command line. ``--debug-rollout-only``: no Megatron trainer (nor its HF config check); the tests
    convert the samples and compute the advantages themselves."""

    def manager(mode, top_p=1.0, env=GRIDNAV, extra=""):
        code, (student, teacher) = slime_code, servers
        rows = list(code.make_data.task_rows(4, seed=0, params={"size": 5, "walls": 0.0}, min_len=3, max_len=4))
        rows[1]["metadata"]["broken"] = True  # only FAILING_ENV reads it
        (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        config = {"max_turns": 8, "max_turn_response_len": 128, "rollout_interaction_env_path": env}
        (tmp_path / "tcod.yaml").write_text(yaml.safe_dump(config))
        argv = f"""train.py --debug-rollout-only --hf-checkpoint {hf_checkpoint[0]}
            --prompt-data {tmp_path}/train.jsonl --input-key input --label-key label --num-rollout {len(ROLLOUT_IDS)}
            --rollout-batch-size 2 --n-samples-per-prompt 2 --rollout-max-response-len 2048 --rollout-temperature 1.0
            --rollout-num-gpus 1 --rollout-num-gpus-per-engine 1 --sglang-router-ip 127.0.0.1 --sglang-router-port
            {student.handle.port} --custom-generate-function-path examples.multi_turn_tcod.rollout.generate
            --custom-config-path {tmp_path}/tcod.yaml --use-opd --opd-type sglang --opd-kl-coef {OPD_KL_COEF}
            --custom-rm-path slime.rollout.on_policy_distillation.reward_func --rm-url {teacher.url}/generate
            --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
            --use-rollout-logprobs --use-tcod --tcod-mode {mode} --tcod-eta 1 --rollout-top-p {top_p} {extra}"""
        monkeypatch.setattr(sys, "argv", argv.split())
        return RolloutManagerState(code, code.arguments.parse_args())

    return manager


class RolloutManagerState:
    """What ``RolloutManager.__init__`` sets up for these methods, without Ray or engines; the methods are slime's."""

    def __init__(self, code, args):
        manager = code.ray_rollout.RolloutManager.__ray_actor_class__  # the class under @ray.remote
        self.code, self.args = code, args
        self._get_rollout_data = manager._get_rollout_data.__get__(self)
        self._post_process_rewards = manager._post_process_rewards.__get__(self)
        self._convert_samples_to_train_data = manager._convert_samples_to_train_data.__get__(self)
        code.http_utils.init_http_client(args)
        code.sglang_rollout.GenerateState.clear_instances()  # the singleton keeps the args it was first built with
        self.data_source = code.misc.load_function(args.data_source_path)(args)
        self.generate_rollout = code.misc.load_function(args.rollout_function_path)
        self.custom_reward_post_process_func = code.misc.load_function(args.custom_reward_post_process_path)
        self.custom_convert_samples_to_train_data_func = None

    def train_data(self, rollout_id: int):
        """One rollout as ``RolloutManager.generate`` makes it, then the trainer's advantages."""
        self.code.sample_hooks.set_current_rollout_id(rollout_id)
        samples, _ = self._get_rollout_data(rollout_id=rollout_id)
        data = self._convert_samples_to_train_data(samples)
        # What _split_train_data_by_dp ships to the trainer.
        self.code.rollout_data_utils.tensorize_rollout_data_for_training(data)
        self.code.loss.compute_advantages_and_returns(self.args, data)
        return samples, data


def mask_runs(tokenizer, sample) -> list[tuple[int, str]]:
    """The response as (loss mask, text) runs."""
    response = sample.tokens[len(sample.tokens) - sample.response_length :]
    runs = itertools.groupby(zip(sample.loss_mask, response, strict=True), key=lambda pair: pair[0])
    return [(mask, tokenizer.decode([token for _, token in run])) for mask, run in runs]


@pytest.mark.parametrize("mode,top_p", [("f2b", 1.0), ("b2f", 1.0), ("b2f", 0.9)])
def test_tcod_curriculum_trains_pure_opd_through_slime_rollout(manager, hf_checkpoint, servers, mode, top_p):
    (_, tokenizer), (student, teacher) = hf_checkpoint, servers
    run = manager(mode, top_p)
    for rollout_id in ROLLOUT_IDS:
        student.requests.clear()
        teacher.requests.clear()
        samples, data = run.train_data(rollout_id)
        depth = rollout_id + 1
        assert len(samples) == 4 and data["rewards"] == [0.0] * 4  # pure distillation
        assert sorted(r["input_ids"] for r in teacher.requests) == sorted(s.tokens for s in samples)
        for request in teacher.requests:
            assert request["return_logprob"] and request["logprob_start_len"] == 0
            assert request["sampling_params"]["max_new_tokens"] == 0
        assert len(student.requests) == sum(s.metadata["num_turns"] for s in samples)

        for i, sample in enumerate(samples):
            expert, md = sample.metadata["expert_actions"], sample.metadata
            prefix = max(0, len(expert) - depth) if mode == "b2f" else 0
            assert md["num_turns"] <= depth and md["prefix_turns"] == prefix, (rollout_id, md)
            assert md["num_turns"] == min(depth, len(expert) - prefix)  # the student walks the shortest path
            assert md["success"] == (mode == "b2f" or depth >= len(expert)) and not sample.remove_sample

            runs = mask_runs(tokenizer, sample)
            trained = [text for m, text in runs if m]
            masked = "".join(text for m, text in runs if not m)
            assert len(trained) == md["num_turns"] and all(STUDENT_TURN.fullmatch(t) for t in trained)
            assert REPLAYED_TURN.findall(masked) == expert[:prefix]  # B2F's replayed turns are not trained
            assert masked.count("<|im_start|>user\n") == prefix + md["num_turns"] - 1  # observations are masked
            assert data["loss_masks"][i].tolist() == sample.loss_mask
            assert top_p == 1.0 or len(sample.rollout_top_p_token_offsets) == sample.response_length + 1

            # Both models scored independently on the final trajectory: a shift by one token changes the numbers.
            start = len(sample.tokens) - sample.response_length - 1
            student_lp = torch.tensor(student.model.token_logprobs(sample.tokens)[start:])
            teacher_lp = torch.tensor(teacher.model.token_logprobs(sample.tokens)[start:])
            mask = data["loss_masks"][i].float()
            torch.testing.assert_close(data["teacher_log_probs"][i], teacher_lp)
            torch.testing.assert_close(data["rollout_log_probs"][i], student_lp * mask)
            # Masked positions are left to the loss mask: the policy loss weights advantages by it.
            torch.testing.assert_close(
                data["advantages"][i] * mask, -OPD_KL_COEF * (student_lp - teacher_lp) * mask, rtol=1e-5, atol=1e-5
            )


def test_routing_replay_converts_a_batch_with_a_failed_episode(manager, monkeypatch, tmp_path, servers):
    student, _ = servers
    (tmp_path / "failing_env.py").write_text(FAILING_ENV)
    monkeypatch.setitem(sys.modules, "rollout_env_failing_env", None)  # the module the loop loads leaves after
    routing = f"--use-rollout-routing-replay --num-layers {LAYERS} --moe-router-topk {TOPK}"
    run = manager("b2f", env=str(tmp_path / "failing_env.py"), extra=routing)
    run.args.router_policy = "consistent_hashing"  # a sglang_router flag, which this test's stub does not add
    student.requests.clear()

    samples, data = run.train_data(0)  # includes the R3 check of every sample's routing

    assert {r["routing_key"] for r in student.requests} == {s.session_id for s in samples}
    failed = [i for i, sample in enumerate(samples) if sample.metadata["outcome"] == "env_error"]
    assert failed and not samples[0].remove_sample  # the first sample sets the batch's routing fields
    for i, sample in enumerate(samples):  # the engine's own routing, a failed episode's from a prefill request
        assert data["rollout_routed_experts"][i].tolist() == routed_rows(sample.tokens)
        assert sample.remove_sample == (i in failed) and (data["loss_masks"][i].sum() == 0) == (i in failed)
    prefills = [r for r in student.requests if r["sampling_params"]["max_new_tokens"] == 0]
    assert sorted(r["input_ids"] for r in prefills) == sorted(samples[i].tokens for i in failed)


def test_a_generate_function_without_the_curriculum_fails_the_first_rollout_step(
    manager, monkeypatch, tmp_path, request
):
    (tmp_path / "tcod_single_turn.py").write_text(
        "async def generate(args, sample, sampling_params):\n    return sample\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop("tcod_single_turn", None))  # the module slime loads leaves after
    run = manager("b2f", extra="--custom-generate-function-path tcod_single_turn.generate")  # the last one wins
    with pytest.raises(RuntimeError, match="tcod_single_turn.generate did not play TCOD's curriculum for rollout 0"):
        run.train_data(0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
