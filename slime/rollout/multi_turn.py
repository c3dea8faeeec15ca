"""The agent loop: LLM -> env.step -> repeat, one loss-masked Sample per trajectory.

Use with ``--custom-generate-function-path slime.rollout.multi_turn.generate`` (slime's signature)
and ``--rollout-interaction-env-path`` naming the environment: a module exposing upstream slime's
``build_env(sample, args)``, or a factory ``make_env(args, sample)`` (both in ``interaction_env.py``).
Part of the slime contribution: it calls only what upstream slime has (``Sample``,
``http_utils.post``) and runs unchanged there and in this project's runtime.

Token in, token out: the sequence grows only by appending the engine's sampled ids (trainable, with
their log-probs) and encoded observations (not trainable). Earlier turns are never re-tokenized, so
the teacher and the trainer see exactly the tokens the student sampled.

The episode follows ``sample.metadata["episode_plan"]`` written by the rollout function
(``slime.rollout.tcod``): ``full`` plays up to ``--max-turns``; ``f2b`` cuts after ``depth`` student
turns (a normal outcome, recorded as ``cut``); ``b2f`` first replays ``max(0, L - depth)`` turns into
the prompt part, where nothing is trained, then the student plays to the end. ``L`` and the turns come
from the expert's actions or, with ``--tcod-prefix-source teacher``, from the teacher's own episode
(``slime.rollout.teacher_prefix``: played once per task, cached, replayed).

Outcomes in ``metadata["outcome"]``: done, cut, max_turns, context_full, replay_finished, env_error.

Length limits: a turn never asks for more tokens than the sequence may still take: the response budget
(``--rollout-max-response-len``), ``--rollout-max-context-len``, and, where this project's runtime has
read them from the servers (``args.engine_limits``, see :func:`request_room`), the engine's context (SGLang
answers 400 to a prompt plus ``max_new_tokens`` above it) and, in training with a server teacher, the
longest sequence the teacher can score. The B2F teacher-prefix turn is also held to the teacher's own
context. When no room is left the episode ends as ``context_full``; one that ends before any student
token is kept out of training like a failed one.
An exception in the environment, a return that breaks its contract (a NaN reward included), or a call
(build, reset, step, expert_actions, close) that takes longer than ``--env-step-timeout`` seconds ends
the episode as FAILED (error in ``metadata["error"]``, naming the environment class and the call);
engine errors are not environment faults and propagate. Environment calls run on daemon threads, so
one that never returns is abandoned there and cannot keep a stopped run alive.

Rewards, as upstream's ``generate_and_rm`` expects them: the environment's return is kept in
``metadata["task_reward"]``. In training with a reward model (``--custom-rm-path``, e.g. the OPD
teacher) ``sample.reward`` is left ``None`` so that the reward model runs; the OPD post-processing
reads the task reward back. Otherwise (evaluation, or no reward model) ``sample.reward`` is the return.

Samples that must not train (failed episodes, B2F replays that finished the task) get
``remove_sample = True``, upstream's mechanism: the trainer zeroes their loss mask. They always carry
at least one (masked) response token, so that no trainer sees an empty response.

Sampling seeds: when ``sampling_params`` carries ``sampling_seed`` (upstream sets one with
``--sglang-enable-deterministic-inference``; this project's runtime always does), turn ``t`` uses that
seed plus ``1 + t``, so every turn draws differently and a rerun draws the same.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from slime.rollout.chat_layout import (action_stop_token_id, decode_action, encode_action, encode_observation,
                                      encode_prompt)
from slime.rollout.expert_sft import expert_actions_for
from slime.rollout.interaction_env import EnvironmentContractError, build_interaction_env
from slime.rollout.tcod import plan_prefix_length
from slime.rollout.teacher_prefix import replay_teacher_prefix
from slime.utils.http_utils import post
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


SEED_MODULUS = 2**31 - 1
_TOKENIZERS: dict[str, object] = {}


DEFAULT_ENV_STEP_TIMEOUT = 300.0
# A cancelled episode (Ctrl-C under asyncio.run) still closes its env, but does not wait long for it.
CLOSE_GRACE_ON_CANCEL = 5.0


class EnvironmentFault(RuntimeError):
    """The environment raised or broke its contract; the episode is recorded as FAILED and the run goes on."""


class EnvironmentTimeout(EnvironmentFault):
    """An environment call did not return within --env-step-timeout."""


def env_step_timeout(args) -> float:
    return float(getattr(args, "env_step_timeout", None) or DEFAULT_ENV_STEP_TIMEOUT)


def _in_daemon_thread(fn, args) -> asyncio.Future:
    """Run ``fn(*args)`` on a new daemon thread; the future gets ``(True, result)`` or ``(False, error)``.

    Not ``asyncio.to_thread``: its executor's threads are joined when the loop shuts down and again at
    interpreter exit, so one env call that never returns kept a Ctrl-C'd run alive. A daemon thread
    is simply abandoned. Errors travel as values so that a TimeoutError raised by the env itself is
    not mistaken for our bound running out.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def deliver(outcome):
        if not future.done():  # a timed-out or cancelled wait no longer listens
            future.set_result(outcome)

    def run():
        try:
            outcome = (True, fn(*args))
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome = (False, err)
        try:
            loop.call_soon_threadsafe(deliver, outcome)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this call any more

    threading.Thread(target=run, name=f"env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


async def _env_call(seconds: float, what: str, fn, *args):
    """``fn(*args)`` off the event loop (environments may block: a JVM, a game engine), bounded in time."""
    future = _in_daemon_thread(fn, args)
    try:
        ok, value = await asyncio.wait_for(future, seconds)
    except asyncio.TimeoutError:
        raise EnvironmentTimeout(f"{what} did not return within {seconds:g} s (--env-step-timeout); "
                                 "the call is abandoned on its thread") from None
    if ok:
        return value
    if isinstance(value, EnvironmentContractError):
        raise EnvironmentFault(f"{what}: environment contract: {value}") from value
    if isinstance(value, Exception):  # any env error ends only this episode
        raise EnvironmentFault(f"{what}: {type(value).__name__}: {value}") from value
    raise value  # KeyboardInterrupt / SystemExit raised inside the env stop the run, as before


def get_tokenizer(args):
    """The policy tokenizer, loaded once per process (the same files the engines serve)."""
    path = args.hf_checkpoint
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        # Upstream slime has no such flag and loads its tokenizers trusting remote code: keep that there.
        trust = bool(getattr(args, "trust_remote_code", True))
        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    return _TOKENIZERS[path]


def engine_url(args, sample: Sample) -> str:
    """slime's router when one is configured; else the engines this project's runtime started."""
    if getattr(args, "sglang_router_ip", None):
        return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    urls = getattr(args, "rollout_engine_urls", None)
    if not urls:
        raise RuntimeError("no rollout engine: set --sglang-router-ip/--sglang-router-port")
    return f"{urls[(sample.index or 0) % len(urls)]}/generate"


def request_room(args, n_tokens: int, role: str = "rollout") -> int | None:
    """New tokens a server accepts after an ``n_tokens`` prompt (<= 0: none), or None when unknown.

    This project's runtime reads each server's limits at start-up into ``args.engine_limits[role]``
    (``role`` "rollout" for the policy engines, "teacher" for the ``--rm-url`` server): ``context_len``
    (SGLang refuses a prompt plus ``max_new_tokens`` above it) and ``max_prompt_len`` (it refuses longer
    prompts). Upstream slime sets no such attribute, and then nothing is clamped here.
    """
    limits = (getattr(args, "engine_limits", None) or {}).get(role) or {}
    context, max_prompt = limits.get("context_len"), limits.get("max_prompt_len")
    if max_prompt is not None and n_tokens > max_prompt:
        return 0
    return None if context is None else context - n_tokens


def teacher_scores_samples(args, evaluation: bool) -> bool:
    """A teacher server scores every finished training sequence (server-teacher OPD)."""
    return not evaluation and bool(getattr(args, "use_opd", False)) and getattr(args, "opd_type", None) == "sglang"


def token_room(args, n_tokens: int, evaluation: bool = False) -> int | None:
    """How many tokens a sequence of ``n_tokens`` may still grow by (None: no limit known):
    ``--rollout-max-context-len``, the rollout engine's context, and in training with a teacher server
    the longest sequence that server scores (a score-only request is a prompt of the whole sequence)."""
    bounds = [request_room(args, n_tokens, "rollout")]
    if getattr(args, "rollout_max_context_len", None):
        bounds.append(int(args.rollout_max_context_len) - n_tokens)
    if teacher_scores_samples(args, evaluation):
        max_prompt = ((getattr(args, "engine_limits", None) or {}).get("teacher") or {}).get("max_prompt_len")
        if max_prompt is not None:
            bounds.append(int(max_prompt) - n_tokens)
    known = [b for b in bounds if b is not None]
    return min(known) if known else None


def output_log_probs(meta_info: dict) -> list[float]:
    entries = meta_info.get("output_token_logprobs")
    if entries is None:
        raise RuntimeError("engine reply has no meta_info.output_token_logprobs (was return_logprob sent?)")
    return [float(entry[0]) for entry in entries]


class _Episode:
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
        self.response_budget = args.rollout_max_response_len
        self.env_timeout = env_step_timeout(args)

    async def env_call(self, env, call: str, fn, *args):
        return await _env_call(self.env_timeout, f"{env.label}: {call}", fn, *args)

    def room(self) -> int:
        """Tokens that may still be added to the sequence (see :func:`token_room`)."""
        room = self.response_budget - self.sample.response_length
        limit = token_room(self.args, len(self.sample.tokens), self.evaluation)
        return room if limit is None else min(room, limit)

    def teacher_room(self) -> int:
        """Tokens the B2F teacher-prefix turn may ask for: the sequence's room and the teacher's context."""
        room = self.room()
        limit = request_room(self.args, len(self.sample.tokens), "teacher")
        return room if limit is None else min(room, limit)

    def record_step(self, reward, info) -> None:
        self.turn_rewards.append(float(reward))
        self.total_reward += float(reward)
        if info.get("success"):
            self.success = True

    async def sample_turn(self, url: str, turn: int, sampling_params: dict, *, salt: int = 0, room: int | None = None):
        params = dict(sampling_params)
        params["max_new_tokens"] = min(self.args.max_turn_response_len, self.room() if room is None else room)
        params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | {self.stop_id})
        params["no_stop_trim"] = True
        if sampling_params.get("sampling_seed") is not None:
            params["sampling_seed"] = (int(sampling_params["sampling_seed"]) + 1 + turn + salt) % SEED_MODULUS
        return await post(url, {"input_ids": self.sample.tokens, "sampling_params": params, "return_logprob": True})

    def action_text(self, ids: list[int]) -> str:
        return decode_action(self.tokenizer, ids)


async def _replay_prefix(ep: _Episode, env, plan: dict, observation: str, sampling_params: dict):
    """Play the B2F prefix into the prompt part. Returns (observation, end, replayed turns), ``end`` being
    None, "replay_finished" (the task ended) or "context_full" (no room left for a teacher turn).

    ``--tcod-prefix-source expert``: the task's expert actions (``max(0, L_exp - depth)`` of them);
    ``teacher``: the teacher's own episode, cached per task (``teacher_prefix.py``). A task with neither
    (no expert actions; a teacher that failed it) plays the whole episode: ``prefix_fallback``.
    """
    if (plan.get("prefix_source") or "expert") == "teacher":
        return await replay_teacher_prefix(ep, env, plan, observation, sampling_params)
    expert = await ep.env_call(env, "expert_actions()", expert_actions_for, env, ep.sample)
    if not expert:
        ep.sample.metadata["prefix_fallback"] = True
    prefix = plan_prefix_length(plan, len(expert) if expert else 0)
    if prefix:
        ep.sample.metadata["prefix_source"] = "expert"
    for i in range(prefix):
        ids = encode_action(ep.tokenizer, expert[i])
        observation, reward, done, info = await ep.env_call(env, "step()", env.step, expert[i])
        ep.record_step(reward, info or {})
        ep.sample.tokens.extend(ids)
        if done:
            return observation, "replay_finished", i + 1
        ep.sample.tokens.extend(encode_observation(ep.tokenizer, observation))
    return observation, None, prefix


async def _play(ep: _Episode, env, plan: dict, sampling_params: dict) -> str:
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
        if ep.stop_id not in ids:  # cut by the turn limit or the budget; see step_metrics.warn_if_turns_cut
            ep.turns_without_stop += 1
        start = sample.response_length
        sample.append_response_tokens(ep.args, tokens=ids, log_probs=output_log_probs(out["meta_info"]),
                                      trainable=True, update_terminal_info=False)
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
        sample.status = Sample.Status.COMPLETED  # the curriculum's cut is a normal outcome, not a truncation
        return "cut"
    sample.status = Sample.Status.TRUNCATED
    return "max_turns"


def _episode_plan(args, sample: Sample, evaluation: bool) -> dict:
    plan = sample.metadata.get("episode_plan")
    if plan is None and getattr(args, "use_tcod", False) and not evaluation:
        # Without this the curriculum would silently switch off and every episode would play in full.
        raise ValueError("--use-tcod: this sample has no episode plan; run with "
                         "--rollout-function-path slime.rollout.tcod.generate_rollout")
    if evaluation or plan is None:
        return {"mode": "full", "max_student_turns": args.max_turns}
    return plan


def _keep_out_of_training(ep: _Episode, sample: Sample) -> None:
    """Mark the sample removed (upstream's mechanism) and give it one masked response token.

    A failed reset leaves no tokens and a finished replay leaves no response; a trainer computes
    log-probs over the response span, so it gets a filler that the zeroed loss mask ignores.
    """
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


async def _close(env, seconds: float, sample: Sample):
    """Close ``env``; returns the timeout if close() hung. A close that raises is only logged."""
    try:
        await _env_call(seconds, f"{env.label}: close()", env.close)
    except EnvironmentTimeout as err:
        return err
    except EnvironmentFault as err:  # a failing close must not hide the episode
        logger.warning("env.close() raised for sample %s: %s", sample.index, err)
    return None


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """slime's custom generate hook: play one episode and return it as one loss-masked Sample."""
    if not getattr(args, "max_turns", None):
        raise ValueError("slime.rollout.multi_turn.generate needs --max-turns (and --rollout-interaction-env-path)")
    if getattr(args, "partial_rollout", False):
        raise ValueError("slime.rollout.multi_turn.generate does not support --partial-rollout: an episode "
                         "cannot resume in an environment that is gone")
    tokenizer = get_tokenizer(args)
    plan = _episode_plan(args, sample, evaluation)
    ep = _Episode(args, sample, tokenizer, evaluation)
    env, close_bound, close_timeout = None, ep.env_timeout, None
    try:
        path = getattr(args, "rollout_interaction_env_path", None)  # build_interaction_env says if it is unset
        env = await _env_call(ep.env_timeout, f"environment {path}: build", build_interaction_env, args, sample)
        outcome = await _play(ep, env, plan, sampling_params)
    except EnvironmentFault as err:
        outcome = _fail(sample, err)
    except asyncio.CancelledError:
        close_bound = min(close_bound, CLOSE_GRACE_ON_CANCEL)
        raise
    finally:
        if env is not None:
            close_timeout = await _close(env, close_bound, sample)
    if close_timeout is not None and outcome != "env_error":
        # A close that hangs leaves the env (and its thread) in an unknown state: report it, don't hide it.
        outcome = _fail(sample, close_timeout)
    if sample.loss_mask is None:
        sample.loss_mask = []
    if outcome in ("env_error", "replay_finished") or sample.response_length == 0:
        # A context already full before the first student turn leaves nothing to train on either.
        _keep_out_of_training(ep, sample)
    sample.response = tokenizer.decode(sample.tokens[len(sample.tokens) - sample.response_length:])
    sample.metadata.update({
        "task_reward": ep.total_reward,
        "turn_spans": ep.turn_spans,
        "turn_rewards": ep.turn_rewards,
        "num_turns": len(ep.turn_spans),
        "turns_without_stop": ep.turns_without_stop,
        "success": ep.success,
        "outcome": outcome,
    })
    sample.metadata.setdefault("prefix_turns", 0)
    # Leave the reward to the reward model when one will run (upstream calls it only for reward None).
    reward_model = getattr(args, "custom_rm_path", None) and not evaluation
    sample.reward = None if reward_model else ep.total_reward
    return sample
