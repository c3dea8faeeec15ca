"""The agent loop: LLM -> env.step -> repeat, one loss-masked Sample per trajectory.

``--custom-generate-function-path examples.multi_turn_tcod.rollout.generate``, with ``max_turns``,
``max_turn_response_len``, ``rollout_interaction_env_path`` and ``env_step_timeout`` from the
``--custom-config-path`` YAML (``multi_turn_tcod_config.yaml``).

Token in, token out: the sequence grows only by the engine's sampled ids (trainable, with their
log-probs) and encoded observations (masked). The episode follows ``sample.metadata["episode_plan"]`` written by
``slime.rollout.tcod.generate_rollout``: ``full`` plays up to ``max_turns``; ``f2b`` stops after
``depth`` student turns; ``b2f`` first replays ``max(0, L - depth)`` expert (or teacher) turns into the
masked part, then the student plays to the end. ``metadata["outcome"]`` is one of done, cut, max_turns,
context_full, replay_finished, env_error.

Samples that must not train (failed episodes, B2F replays that finished the task) get
``remove_sample = True`` and one masked response token. ``sample.reward`` is left ``None`` in training
when a reward model (the OPD teacher) is set, so that upstream's ``generate_and_rm`` runs it; the
environment's return is kept in ``metadata["task_reward"]``.
"""

import asyncio
import logging

from examples.multi_turn_tcod.chat_layout import (
    action_stop_token_id,
    decode_action,
    encode_action,
    encode_observation,
    encode_prompt,
)
from examples.multi_turn_tcod.env_adapter import (
    EnvironmentFault,
    build_interaction_env,
    call_env,
    close_env,
    env_step_timeout,
    expert_actions_for,
)

from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

SEED_MODULUS = 2**31 - 1
# A cancelled episode (Ctrl-C) still closes its env, but does not wait long for it.
CLOSE_GRACE_ON_CANCEL = 5.0
_TOKENIZERS: dict[str, object] = {}


def get_tokenizer(args):
    """The policy tokenizer, loaded once per process (the files the engines serve)."""
    path = args.hf_checkpoint
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        trust = bool(getattr(args, "trust_remote_code", True))
        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    return _TOKENIZERS[path]


def engine_url(args, sample: Sample) -> str:
    """slime's router when one is configured, else the engines a standalone runtime started."""
    if getattr(args, "sglang_router_ip", None):
        return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    urls = getattr(args, "rollout_engine_urls", None)
    if not urls:
        raise RuntimeError("no rollout engine: set --sglang-router-ip/--sglang-router-port")
    return f"{urls[(sample.index or 0) % len(urls)]}/generate"


def request_room(args, n_tokens: int, role: str = "rollout") -> int | None:
    """New tokens a server accepts after an ``n_tokens`` prompt, or None when its limits are unknown.

    ``args.engine_limits[role]`` (``context_len``, ``max_prompt_len``) is set only by runtimes that read
    them from the servers; upstream sets none, and then nothing is clamped here.
    """
    limits = (getattr(args, "engine_limits", None) or {}).get(role) or {}
    context, max_prompt = limits.get("context_len"), limits.get("max_prompt_len")
    if max_prompt is not None and n_tokens > max_prompt:
        return 0
    return None if context is None else context - n_tokens


def teacher_scores_samples(args, evaluation: bool) -> bool:
    return not evaluation and bool(getattr(args, "use_opd", False)) and getattr(args, "opd_type", None) == "sglang"


def token_room(args, n_tokens: int, evaluation: bool = False) -> int | None:
    """How many tokens a sequence may still grow by (None: no limit known): ``--rollout-max-context-len``,
    the engine's context and, in training with a teacher server, the longest sequence it scores."""
    bounds = [request_room(args, n_tokens, "rollout")]
    if getattr(args, "rollout_max_context_len", None):
        bounds.append(int(args.rollout_max_context_len) - n_tokens)
    if teacher_scores_samples(args, evaluation):
        teacher = (getattr(args, "engine_limits", None) or {}).get("teacher") or {}
        if teacher.get("max_prompt_len") is not None:
            bounds.append(int(teacher["max_prompt_len"]) - n_tokens)
    known = [b for b in bounds if b is not None]
    return min(known) if known else None


def output_log_probs(meta_info: dict) -> list[float]:
    entries = meta_info.get("output_token_logprobs")
    if entries is None:
        raise RuntimeError("engine reply has no meta_info.output_token_logprobs (was return_logprob sent?)")
    return [float(entry[0]) for entry in entries]


class Episode:
    """Book-keeping of one trajectory while it is played."""

    def __init__(self, args, sample: Sample, tokenizer, evaluation: bool):
        self.args = args
        self.sample = sample
        self.tokenizer = tokenizer
        self.evaluation = evaluation
        self.stop_id = action_stop_token_id(tokenizer)
        self.turn_spans: list[list[int]] = []
        self.turns_without_stop = 0
        self.turn_rewards: list[float] = []
        self.success = False
        self.total_reward = 0.0
        self.env_timeout = env_step_timeout(args)

    async def env_call(self, env, call: str, fn, *args):
        return await call_env(self.env_timeout, f"{env.label}: {call}", fn, *args)

    async def build_env(self, what: str = "build"):
        path = getattr(self.args, "rollout_interaction_env_path", None)
        return await call_env(
            self.env_timeout, f"environment {path}: {what}", build_interaction_env, self.args, self.sample
        )

    def room(self) -> int:
        room = self.args.rollout_max_response_len - self.sample.response_length
        limit = token_room(self.args, len(self.sample.tokens), self.evaluation)
        return room if limit is None else min(room, limit)

    def record_step(self, reward, info) -> None:
        self.turn_rewards.append(float(reward))
        self.total_reward += float(reward)
        self.success = self.success or bool(info.get("success"))

    async def sample_turn(self, url: str, turn: int, sampling_params: dict, *, salt: int = 0, room=None):
        params = dict(sampling_params)
        turn_len = getattr(self.args, "max_turn_response_len", None) or self.args.rollout_max_response_len
        params["max_new_tokens"] = min(turn_len, self.room() if room is None else room)
        params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | {self.stop_id})
        params["no_stop_trim"] = True
        if sampling_params.get("sampling_seed") is not None:
            # Every turn draws differently and a rerun draws the same.
            params["sampling_seed"] = (int(sampling_params["sampling_seed"]) + 1 + turn + salt) % SEED_MODULUS
        return await post(url, {"input_ids": self.sample.tokens, "sampling_params": params, "return_logprob": True})

    def action_text(self, ids: list[int]) -> str:
        return decode_action(self.tokenizer, ids)


async def _replay_prefix(ep: Episode, env, plan: dict, observation: str, sampling_params: dict):
    """Play the B2F prefix into the masked part; returns (observation, end, replayed turns), ``end`` being
    None, "replay_finished" or "context_full". A task without expert actions plays in full."""
    if plan.get("prefix_source", "expert") != "expert":
        # Another prefix source (a runtime's teacher episodes) is a plugin with this function's signature.
        replay = load_function(ep.args.tcod_prefix_replay_path)
        return await replay(ep, env, plan, observation, sampling_params)
    expert = await ep.env_call(env, "expert_actions()", expert_actions_for, env, ep.sample)
    if not expert:
        ep.sample.metadata["prefix_fallback"] = True
    prefix = max(0, len(expert) - int(plan["depth"])) if expert else 0
    if prefix:
        ep.sample.metadata["prefix_source"] = "expert"
    for i in range(prefix):
        observation, reward, done, info = await ep.env_call(env, "step()", env.step, expert[i])
        ep.record_step(reward, info or {})
        ep.sample.tokens.extend(encode_action(ep.tokenizer, expert[i]))
        if done:
            return observation, "replay_finished", i + 1
        ep.sample.tokens.extend(encode_observation(ep.tokenizer, observation))
    return observation, None, prefix


async def _play(ep: Episode, env, plan: dict, sampling_params: dict) -> str:
    """Run the episode; returns the outcome."""
    sample = ep.sample
    observation = await ep.env_call(env, "reset()", env.reset)
    sample.tokens = list(encode_prompt(ep.tokenizer, observation))
    sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []
    prefix_turns = 0
    if plan.get("mode") == "b2f":
        observation, end, prefix_turns = await _replay_prefix(ep, env, plan, observation, sampling_params)
        sample.metadata["prefix_turns"] = prefix_turns
        if end == "context_full":
            sample.status = Sample.Status.TRUNCATED
        if end is not None:
            return end
    url = engine_url(ep.args, sample)
    turns = int(plan.get("max_student_turns") or ep.args.max_turns)
    for turn in range(turns):
        if ep.room() <= 0:
            sample.status = Sample.Status.TRUNCATED
            return "context_full"
        out = await ep.sample_turn(url, prefix_turns + turn, sampling_params)
        ids = list(out["output_ids"])
        ep.turns_without_stop += ep.stop_id not in ids  # cut by the turn limit or the budget
        start = sample.response_length
        sample.append_response_tokens(
            ep.args,
            tokens=ids,
            log_probs=output_log_probs(out["meta_info"]),
            trainable=True,
            update_terminal_info=False,
        )
        ep.turn_spans.append([start, sample.response_length])
        observation, reward, done, info = await ep.env_call(env, "step()", env.step, ep.action_text(ids))
        ep.record_step(reward, info or {})
        if done:
            sample.status = Sample.Status.COMPLETED
            return "done"
        if turn + 1 == turns:
            break  # no student turn follows: the last observation would be scored and masked for nothing
        obs_ids = encode_observation(ep.tokenizer, observation)
        if len(obs_ids) > ep.room():
            sample.status = Sample.Status.TRUNCATED
            return "context_full"
        sample.append_response_tokens(ep.args, tokens=obs_ids, trainable=False, update_terminal_info=False)
    if plan.get("mode") == "f2b":
        sample.status = Sample.Status.COMPLETED  # the curriculum's cut is a normal outcome
        return "cut"
    sample.status = Sample.Status.TRUNCATED
    return "max_turns"


def _episode_plan(args, sample: Sample, evaluation: bool) -> dict:
    plan = sample.metadata.get("episode_plan")
    if plan is None and getattr(args, "use_tcod", False) and not evaluation:
        # Without this the curriculum would silently switch off and every episode would play in full.
        raise ValueError(
            "--use-tcod: this sample has no episode plan; run with "
            "--rollout-function-path slime.rollout.tcod.generate_rollout"
        )
    if evaluation or plan is None:
        return {"mode": "full", "max_student_turns": args.max_turns}
    return plan


def _keep_out_of_training(ep: Episode, sample: Sample) -> None:
    """``remove_sample`` (upstream's mechanism) plus one masked token: trainers need a response span."""
    sample.remove_sample = True
    if not sample.tokens:
        text = sample.prompt if isinstance(sample.prompt, str) else ""
        sample.tokens = list(encode_prompt(ep.tokenizer, text))
    if sample.response_length == 0:
        sample.append_response_tokens(ep.args, tokens=[ep.stop_id], trainable=False, update_terminal_info=False)


def _fail(sample: Sample, err: EnvironmentFault) -> str:
    sample.status = Sample.Status.FAILED
    sample.metadata["error"] = str(err)
    logger.warning("episode of sample %s failed in the environment: %s", sample.index, err)
    return "env_error"


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """slime's custom generate hook: play one episode and return it as one loss-masked Sample."""
    if not getattr(args, "max_turns", None):
        raise ValueError("examples.multi_turn_tcod.rollout.generate needs max_turns (set in --custom-config-path)")
    if getattr(args, "partial_rollout", False):
        raise ValueError("the multi-turn rollout does not support --partial-rollout: an episode cannot resume")
    tokenizer = get_tokenizer(args)
    plan = _episode_plan(args, sample, evaluation)
    ep = Episode(args, sample, tokenizer, evaluation)
    env, close_bound, close_timeout = None, ep.env_timeout, None
    try:
        env = await ep.build_env()
        outcome = await _play(ep, env, plan, sampling_params)
    except EnvironmentFault as err:
        outcome = _fail(sample, err)
    except asyncio.CancelledError:
        close_bound = min(close_bound, CLOSE_GRACE_ON_CANCEL)
        raise
    finally:
        if env is not None:
            close_timeout = await close_env(env, close_bound, sample)
    if close_timeout is not None and outcome != "env_error":
        outcome = _fail(sample, close_timeout)  # a hung close leaves the env in an unknown state
    if sample.loss_mask is None:
        sample.loss_mask = []
    if outcome in ("env_error", "replay_finished") or sample.response_length == 0:
        _keep_out_of_training(ep, sample)
    sample.response = tokenizer.decode(sample.tokens[len(sample.tokens) - sample.response_length :])
    sample.metadata.update(
        {
            "task_reward": ep.total_reward,
            "turn_spans": ep.turn_spans,
            "turn_rewards": ep.turn_rewards,
            "num_turns": len(ep.turn_spans),
            "turns_without_stop": ep.turns_without_stop,
            "success": ep.success,
            "outcome": outcome,
        }
    )
    sample.metadata.setdefault("prefix_turns", 0)
    reward_model = getattr(args, "custom_rm_path", None) and not evaluation
    sample.reward = None if reward_model else ep.total_reward
    return sample
