"""The agent loop: LLM -> env.step -> repeat, one loss-masked Sample per trajectory, with TCOD's curriculum.

``--custom-generate-function-path examples.multi_turn_tcod.rollout.generate``; ``max_turns``,
``max_turn_response_len``, ``rollout_interaction_env_path`` and ``env_step_timeout`` come from the
``--custom-config-path`` YAML. The environment module exposes ``build_env(sample, args)`` (the contract
of ``examples/geo3k_vlm_multi_turn``).

Token in, token out: the sequence grows only by the engine's sampled ids (trainable) and encoded
observations (masked), following ``slime.rollout.tcod.episode_plan`` for the current rollout id.
``metadata["outcome"]`` is one of done, cut, max_turns, context_full, replay_finished, aborted, engine_abort,
env_error;
episodes that must not train (the environment failed, a B2F replay finished the task) get
``remove_sample = True``. Training is pure OPD: ``sample.reward`` is ``None`` for the teacher's reward
model (``--opd-type sglang``) or 0.0 (``--opd-type megatron``); the return is ``metadata["task_reward"]``.
"""

import asyncio
import functools
import logging
import math
import numbers
import uuid

from examples.geo3k_vlm_multi_turn.rollout import _load_env_module
from examples.multi_turn_tcod.chat_layout import encode_action, encode_observation, encode_prompt, turn_stop_id

from slime.rollout.sample_hooks import get_current_rollout_id
from slime.rollout.sglang_rollout import GenerateState
from slime.rollout.tcod import b2f_prefix_length, episode_plan
from slime.utils.http_utils import post
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

DEFAULT_ENV_STEP_TIMEOUT = 300.0
SEED_MODULUS = 2**31 - 1


class EnvironmentFault(RuntimeError):
    """The environment raised, hung or broke its contract: the episode fails, the run goes on."""


async def in_thread(timeout: float, fn, *call_args, env=None):
    """``fn(*call_args)`` in a thread, ``asyncio.TimeoutError`` after ``timeout`` s; on the event loop (no thread
    hop, no timeout) for an env, or env module for ``build_env``, with ``blocking = False`` (pure Python, fast)."""
    if not getattr(env, "blocking", True):
        return fn(*call_args)
    return await asyncio.wait_for(asyncio.to_thread(fn, *call_args), timeout)


@functools.cache  # geo3k's loader runs a ``.py`` file again on every call: here once per process and path
def load_env_module(path: str):
    """The module behind ``rollout_interaction_env_path`` (a dotted module or a ``.py`` file), as geo3k loads it."""
    if not path:  # geo3k's loader would fall back to its own VLM environment
        raise ValueError("rollout_interaction_env_path is not set: name the environment in --custom-config-path")
    module = _load_env_module(path)
    if not callable(getattr(module, "build_env", None)):
        raise ValueError(f"rollout_interaction_env_path {path!r} has no callable build_env(sample, args)")
    return module


class Episode:
    """One trajectory while it is played: the sample, its environment, its budget and its records; B2F's prefix
    comes from ``replay_prefix`` (the task's expert actions)."""

    def __init__(self, args, sample: Sample, sampling_params: dict, evaluation: bool):
        self.args, self.sample, self.evaluation = args, sample, evaluation
        self.state = GenerateState(args)
        self.tokenizer = self.state.tokenizer
        self.stop_id = turn_stop_id(self.tokenizer)
        self.sampling_params = dict(sampling_params)
        self.url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
        self.template_kwargs = getattr(args, "apply_chat_template_kwargs", None) or {}
        self.timeout = float(getattr(args, "env_step_timeout", None) or DEFAULT_ENV_STEP_TIMEOUT)
        context = args.eval_max_context_len if evaluation else args.rollout_max_context_len
        self.max_tokens = None if context is None else int(context)
        self.max_response = int(sampling_params["max_new_tokens"])  # eval passes --eval-max-response-len
        self.env = None
        self.turn_spans, self.turn_rewards = [], []
        self.total_reward, self.success, self.turns_without_stop, self.open_turn = 0.0, False, 0, False

    def room(self) -> int:
        """Tokens the trajectory may still grow by: the response budget and the context length."""
        room = self.max_response - self.sample.response_length
        return room if self.max_tokens is None else min(room, self.max_tokens - len(self.sample.tokens))

    async def env_call(self, fn, *call_args, owner=None):
        """``fn(*call_args)`` off the event loop (environments may block), bounded by ``env_step_timeout``."""
        try:
            return await in_thread(self.timeout, fn, *call_args, env=owner or self.env)
        except asyncio.TimeoutError:
            raise EnvironmentFault(
                f"{fn.__name__}() did not return within {self.timeout:g} s (env_step_timeout)"
            ) from None
        except Exception as err:
            raise EnvironmentFault(f"{fn.__name__}(): {type(err).__name__}: {err}") from err

    async def step(self, text: str):
        """``env.step(text)``, its return checked; the step's reward and success recorded."""
        out = await self.env_call(self.env.step, text)
        if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[2] or {}, dict)):
            raise EnvironmentFault(f"step() must return (observation, done, info), got {type(out).__name__}")
        observation, done, info = out
        info = info or {}
        reward = info.get("reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise EnvironmentFault(f"step() gave info['reward'] = {reward!r}; it must be a finite number")
        self.turn_rewards.append(float(reward))
        self.total_reward += self.turn_rewards[-1]
        self.success = self.success or bool(info.get("success"))
        return observation, bool(done)

    def message(self, observation) -> dict:
        """``env.format_observation(observation)``, checked to be a chat message with text content."""
        try:
            message = self.env.format_observation(observation)
        except Exception as err:
            raise EnvironmentFault(f"format_observation(): {type(err).__name__}: {err}") from err
        if not (isinstance(message, dict) and isinstance(message.get("content"), str)):
            raise EnvironmentFault(f"format_observation() must return a text message, got {message!r:.200}")
        return message

    def append_observation(self, observation) -> bool:
        """Append the next user turn (masked); False when it does not fit the budget."""
        ids = encode_observation(self.tokenizer, self.message(observation), self.template_kwargs)
        ids = [self.stop_id] * self.open_turn + ids  # a cut turn is closed before the next user turn
        if len(ids) + 2 > self.room():  # the student's next turn needs a token and its closing <|im_end|>
            return False
        self.sample.append_response_tokens(self.args, tokens=ids, trainable=False)
        self.open_turn = False
        return True

    def headers(self) -> dict | None:
        """Keep an episode's requests on one engine, and its prefix cache, as generate() does."""
        if self.sample.session_id and getattr(self.args, "router_policy", None) == "consistent_hashing":
            return {"X-SMG-Routing-Key": self.sample.session_id}
        return None

    async def student_turn(self, turn: int):
        """One engine reply appended as trainable tokens; returns its text, or None when it was aborted."""
        params = dict(self.sampling_params)
        turn_len = getattr(self.args, "max_turn_response_len", None) or self.max_response
        params["max_new_tokens"] = min(turn_len, self.room())
        params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | {self.stop_id})
        if params.get("sampling_seed") is not None:  # sample i of a group has seed + i: every turn gets its own
            group = max(self.args.n_samples_per_prompt, getattr(self.args, "n_samples_per_eval_prompt", None) or 1)
            params["sampling_seed"] = (int(params["sampling_seed"]) + (1 + turn) * group) % SEED_MODULUS
        payload = {"input_ids": self.sample.tokens, "sampling_params": params, "return_logprob": True}
        if getattr(self.args, "use_rollout_routing_replay", False):
            payload["return_routed_experts"] = True
        output = await post(self.url, payload, headers=self.headers())
        meta_info = output["meta_info"]
        finish = meta_info["finish_reason"]
        if finish["type"] == "abort":
            if not self.state.aborted:  # the engine's own abort (e.g. a request it cannot serve) fails the episode
                self.sample.metadata["error"] = f"the engine aborted the request: {finish.get('message', '')}"
            return None
        entries = meta_info.get("output_token_logprobs") or []
        ids, log_probs = [item[1] for item in entries], [item[0] for item in entries]
        start = self.sample.response_length
        self.sample.append_response_tokens(self.args, tokens=ids, log_probs=log_probs, meta_info=meta_info)
        # A reply stopped on another EOS id (Qwen3 also stops on <|endoftext|>) ended its turn; it still
        # needs the masked <|im_end|> that closes an assistant message before the next observation.
        stopped = finish["type"] == "stop" and bool(ids)
        self.open_turn = not ids or ids[-1] != self.stop_id
        self.turns_without_stop += not stopped  # cut by the turn's budget
        self.turn_spans.append([start, start + len(ids)])
        if stopped and ids[-1] != self.stop_id and finish.get("matched") == ids[-1]:
            ids = ids[:-1]  # the environment reads the action, not the EOS token
        return self.tokenizer.decode([i for i in ids if i != self.stop_id])

    async def replay_prefix(self, plan: dict):
        """B2F: replay the first ``L - depth`` expert actions, at most ``max_turns``, into the masked part.

        Returns (replayed turns, end); ``end`` is None (the student plays on), "replay_finished" or
        "context_full". Expert actions come from ``metadata["expert_actions"]``, else ``env.expert_actions()``.
        """
        actions = self.sample.metadata.get("expert_actions")
        if actions is None and hasattr(self.env, "expert_actions"):
            actions = await self.env_call(self.env.expert_actions)
        if not actions:  # no expert path: the student plays the whole episode
            self.sample.metadata["prefix_fallback"] = True
        prefix = min(b2f_prefix_length(len(actions or []), plan["depth"]), plan["max_turns"])  # the episode's cap
        if prefix:
            self.sample.metadata["prefix_source"] = "expert"
        for i in range(prefix):
            ids = encode_action(self.tokenizer, actions[i])
            if len(ids) + 2 > self.room():
                return i, "context_full"
            self.sample.append_response_tokens(self.args, tokens=ids, trainable=False)
            observation, done = await self.step(actions[i])
            if done:
                return i + 1, "replay_finished"
            if not self.append_observation(observation):
                return i + 1, "context_full"
        return prefix, None


async def _play(ep: Episode, plan: dict) -> str:
    """Reset, replay the B2F prefix, then the student's turns; returns the outcome."""
    sample = ep.sample
    module = load_env_module(ep.args.rollout_interaction_env_path)
    ep.env = await ep.env_call(module.build_env, sample, ep.args, owner=module)
    if ep.env is None:
        raise EnvironmentFault("build_env(sample, args) returned None")
    observation = await ep.env_call(ep.env.reset)
    observation = observation[0] if isinstance(observation, tuple) else observation
    if not observation:  # geo3k's env resets to ({}, info): the task is sample.prompt
        sample.tokens = prompt_ids(ep)
    else:
        observation = observation if isinstance(observation, str) else [ep.message(observation)]
        sample.tokens = encode_prompt(ep.tokenizer, observation, ep.template_kwargs)
    sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []
    if getattr(ep.args, "rollout_top_p", 1.0) != 1.0:  # top-p spans from the start: B2F's prefix is masked
        sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets = [], [0]
    prefix_turns = 0
    if plan["mode"] == "b2f":
        prefix_turns, end = await ep.replay_prefix(plan)
        sample.metadata["prefix_turns"] = prefix_turns
        if end is not None:
            return end
    turns = int(plan["max_turns"]) - prefix_turns  # B2F: replayed and student turns share max_turns
    for turn in range(turns):
        if ep.state.aborted:
            return "aborted"
        if ep.room() < 1:
            return "context_full"
        text = await ep.student_turn(prefix_turns + turn)
        if text is None:
            return "aborted" if ep.state.aborted else "engine_abort"
        observation, done = await ep.step(text)
        if done:
            return "done"
        if turn + 1 < turns and not ep.append_observation(observation):
            return "context_full"
    return "cut" if plan["mode"] == "f2b" else "max_turns"


def prompt_ids(ep: Episode) -> list[int]:
    """``sample.prompt`` as ids; with ``--apply-chat-template`` the dataset has rendered it already."""
    if getattr(ep.args, "apply_chat_template", False) and isinstance(ep.sample.prompt, str):
        return ep.tokenizer.encode(ep.sample.prompt, add_special_tokens=False)
    return encode_prompt(ep.tokenizer, ep.sample.prompt, ep.template_kwargs)


async def route_unrouted_tokens(ep: Episode) -> None:
    """Routing replay needs a row for every token but the last. Tokens the engine never routed (a removed
    episode's prompt or replayed prefix) get the engine's own routing from a prefill-only request, decoded by
    ``Sample``; an engine that returns none fails the rollout rather than replay made-up experts."""
    sample = ep.sample

    def routed() -> int:
        return 0 if sample.rollout_routed_experts is None else len(sample.rollout_routed_experts)

    if routed() >= len(sample.tokens) - 1 or sample.status == Sample.Status.ABORTED:
        return
    payload = {"input_ids": sample.tokens, "sampling_params": {"max_new_tokens": 0}, "return_routed_experts": True}
    output = await post(ep.url, payload, headers=ep.headers())
    sample.append_response_tokens(ep.args, tokens=[], meta_info=output["meta_info"], update_terminal_info=False)
    if routed() < len(sample.tokens) - 1:
        raise RuntimeError(
            f"--use-rollout-routing-replay: the engine routed {routed()} of {len(sample.tokens)} tokens"
        )


STATUS = {
    "done": Sample.Status.COMPLETED,
    "cut": Sample.Status.COMPLETED,  # the curriculum's cut is a normal end
    "max_turns": Sample.Status.COMPLETED,  # as geo3k's turn limit: TRUNCATED is left to the token budgets
    "aborted": Sample.Status.ABORTED,
    "env_error": Sample.Status.FAILED,
    "engine_abort": Sample.Status.FAILED,  # the engine aborted a request that abort() did not
}


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """slime's custom generate hook: play one episode and return it as one loss-masked Sample."""
    return await play_episode(Episode(args, sample, sampling_params, evaluation))


async def play_episode(ep: Episode) -> Sample:
    """The episode of ``ep.sample`` by the step's plan, its outcome, status and metadata recorded on the sample."""
    args, sample, evaluation = ep.args, ep.sample, ep.evaluation
    assert not args.partial_rollout, "Partial rollout is not supported for interaction rollouts."
    if not getattr(args, "max_turns", None):
        raise ValueError("max_turns must be set via --custom-config-path in the custom config file.")
    sample.metadata = sample.metadata or {}
    sample.session_id = sample.session_id or str(uuid.uuid4())  # evaluation keeps engine affinity too
    plan = episode_plan(args, get_current_rollout_id(), args.max_turns, evaluation)
    sample.metadata["episode_plan"] = plan
    try:
        outcome = await _play(ep, plan)
    except EnvironmentFault as err:
        outcome = "env_error"
        sample.metadata["error"] = str(err)
        logger.warning("episode of sample %s failed in the environment: %s", sample.index, err)
    finally:
        if ep.env is not None and hasattr(ep.env, "close"):
            try:
                await in_thread(ep.timeout, ep.env.close, env=ep.env)
            except Exception as err:  # a close that fails does not undo the episode
                logger.warning("env.close() failed for sample %s: %r", sample.index, err)
    sample.status = STATUS.get(outcome, Sample.Status.TRUNCATED)
    if outcome in ("env_error", "engine_abort", "replay_finished") or not any(sample.loss_mask or []):
        sample.remove_sample = True
        if not sample.tokens:
            sample.tokens = prompt_ids(ep)
        if sample.response_length == 0:  # trainers need a response span
            sample.append_response_tokens(args, tokens=[ep.stop_id], trainable=False)
    if getattr(args, "use_rollout_routing_replay", False):
        await route_unrouted_tokens(ep)
    sample.response = ep.tokenizer.decode(sample.tokens[len(sample.tokens) - sample.response_length :])
    sample.metadata.update(
        task_reward=ep.total_reward,
        turn_spans=ep.turn_spans,
        turn_rewards=ep.turn_rewards,
        num_turns=len(ep.turn_spans),
        turns_without_stop=ep.turns_without_stop,
        success=ep.success,
        outcome=outcome,
    )
    sample.metadata.setdefault("prefix_turns", 0)
    if evaluation or not args.use_opd:
        sample.reward = ep.total_reward
    else:  # pure OPD: the teacher server's reply (the OPD reward_func fills it) or nothing to train
        sample.reward = None if args.opd_type == "sglang" else 0.0
    return sample
