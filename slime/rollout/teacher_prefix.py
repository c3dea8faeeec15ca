"""B2F prefixes from the teacher's own episode (``--tcod-prefix-source teacher``), no expert data needed.

The TCOD proposal seeds the student with the first ``L - k(n)`` turns of the teacher's episode, ``L``
being that episode's length. :func:`generate` is the example's agent loop
(``examples.multi_turn_tcod.rollout.play_episode``) on a :class:`TeacherPrefixEpisode`, whose
``replay_prefix`` is :func:`replay_teacher_prefix`; ``validate_prefix_source`` selects it as
``--custom-generate-function-path``. Per task:

1. The teacher server (``--rm-url``) plays the whole episode once, in an environment of its own, from
   reset until done or ``--max-turns``. Its actions, token ids and observations are kept in
   :data:`CACHE`, keyed by the task's identity and ``--rollout-seed`` (the teacher is frozen, so the
   episode would come out the same anyway; the cache saves the teacher's turns at every later step).
2. Each B2F episode replays the first ``max(0, L - k(n))`` recorded turns into the student's own
   environment: every action is executed again with ``env.step`` and the teacher's token ids go into
   the masked part of the sequence, like an expert prefix.
3. An environment that does not replay deterministically is found out by comparing the prompt and each
   observation with the recorded ones. From the first difference on, and for that task at every later
   step, the teacher plays the prefix live in the student's environment (same length ``L - k(n)``).

A task the teacher fails (no success before done, ``--max-turns`` or a full context) falls back to
vanilla OPD: prefix 0, the student plays the whole episode. Seeding the student with a failing path
would teach it to start from the teacher's mistakes. Such samples are counted in
``tcod/prefix_fallback``. The failure is cached too: a frozen teacher would fail again. An aborted
teacher turn is not: the student's episode ends as aborted and the task is played again later.

The cache is a JSON-able ``state_dict``: this runtime checkpoints it (``tcod_teacher_episodes.json``) and a
resumed run replays exactly.
"""

import asyncio
import copy
import hashlib
import json
import logging

from examples.multi_turn_tcod.chat_layout import encode_prompt
from examples.multi_turn_tcod.rollout import SEED_MODULUS, Episode, load_env_module, play_episode

from slime.rollout.tcod import b2f_prefix_length
from slime.utils.http_utils import post
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

# Metadata fields the rollout and the agent loop write into a sample: not part of the task's identity.
_VOLATILE_METADATA = frozenset(
    (
        "episode_plan",
        "prefix_turns",
        "prefix_source",
        "prefix_fallback",
        "teacher_episode_played",
        "task_reward",
        "turn_spans",
        "turn_rewards",
        "num_turns",
        "turns_without_stop",
        "success",
        "outcome",
        "error",
        "teacher_topk",
    )
)
# Per-turn seed offset of the teacher's turns, kept apart from the student's (turn + 1) offsets.
_TEACHER_SALT = 10_000
CACHE_VERSION = 2  # 2: the agent loop on upstream's build_env contract (prompt ids, messages recorded)


class TeacherAborted(RuntimeError):
    """The teacher server aborted a turn (or the rollout was aborted): the episode ends as aborted."""


def task_key(args, sample: Sample) -> str:
    """Cache key: the task (prompt, label, metadata without rollout fields) and ``--rollout-seed``.

    The sample's index is left out on purpose: the ``n_samples_per_prompt`` copies of one prompt, and
    the same prompt in a later epoch, are the same task and share the teacher's episode.
    """
    metadata = {k: v for k, v in (sample.metadata or {}).items() if k not in _VOLATILE_METADATA}
    task = json.dumps(
        {"prompt": sample.prompt, "label": sample.label, "metadata": metadata}, sort_keys=True, default=str
    )
    return f"seed{int(getattr(args, 'rollout_seed', 0) or 0)}:{hashlib.sha256(task.encode()).hexdigest()[:32]}"


def teacher_seed(key: str) -> int:
    """The teacher episode's base sampling seed: a function of the key only, so a replayed-live prefix
    draws what the recorded episode drew."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % SEED_MODULUS


class TeacherEpisodeCache:
    """Teacher episodes by :func:`task_key`; each entry is a plain dict (JSON-able, see ``play_teacher_episode``)."""

    def __init__(self):
        self.entries: dict[str, dict] = {}
        self._pending: dict[str, asyncio.Future] = {}  # keys whose episode is being played right now

    def state_dict(self) -> dict:
        return {"version": CACHE_VERSION, "entries": copy.deepcopy(self.entries)}

    def load_state_dict(self, state: dict | None) -> None:
        """Replace the cache with a saved one (``None``: a checkpoint without teacher episodes: empty)."""
        if state is not None and state.get("version") == 1:
            # Episodes of the agent loop before upstream's build_env contract, in another token layout:
            # replaying them would seed the student with ids this loop never produces. Played again instead.
            logger.warning(
                "teacher-episode cache of an older version (1) in the checkpoint: not used, the "
                "teacher plays its episodes again"
            )
            state = None
        if state is not None and state.get("version") != CACHE_VERSION:
            raise ValueError(f"teacher-episode cache: unknown version {state.get('version')!r}")
        self.entries = copy.deepcopy((state or {}).get("entries", {}))
        self._pending = {}

    def clear(self) -> None:
        self.load_state_dict(None)

    async def get_or_play(self, key: str, play) -> tuple[dict, bool]:
        """(entry, played_now). Concurrent episodes of one task (a group) wait for one teacher episode."""
        if key in self.entries:
            return self.entries[key], False
        if key in self._pending:
            return await asyncio.shield(self._pending[key]), False
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            entry = await play()
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            self._pending.pop(key, None)
        self.entries[key] = entry
        future.set_result(entry)
        return entry, True


CACHE = TeacherEpisodeCache()


# ---------------------------------------------------------------------------- turns and observations
def _teacher_params(sampling_params: dict, key: str) -> dict:
    params = dict(sampling_params)
    if params.get("sampling_seed") is not None:  # seeded only where the student is (deterministic engines)
        params["sampling_seed"] = (teacher_seed(key) + _TEACHER_SALT) % SEED_MODULUS
    return params


def _message(env, observation) -> str:
    """An observation as the chat message the loop encodes, canonical JSON: recorded, compared, checkpointed."""
    return json.dumps(env.format_observation(observation), sort_keys=True, default=str)


async def _reset(ep: Episode) -> None:
    """Reset ``ep.env`` and write the prompt ids, as ``rollout._play`` does for the student's episode.

    A copy of the loop's reset handling: were the two ever to differ, the prompt ids would, and the
    replay would go live (see :func:`replay_teacher_prefix`) rather than replay a wrong prefix.
    """
    sample = ep.sample
    observation = await ep.env_call(ep.env.reset)
    observation = observation[0] if isinstance(observation, tuple) else observation
    if not observation:
        observation = sample.prompt
    elif not isinstance(observation, str):
        observation = ep.env.format_observation(observation)["content"]
    sample.tokens = encode_prompt(ep.tokenizer, observation, ep.template_kwargs)
    sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []


async def teacher_turn(ep: Episode, turn: int, params: dict) -> tuple[list[int], str]:
    """One teacher reply appended to ``ep.sample`` as masked tokens; returns (its ids, closing
    ``<|im_end|>`` included, and its text for ``env.step``). Needs ``ep.room() >= 2``."""
    if ep.state.aborted:
        raise TeacherAborted("the rollout was aborted")
    request = dict(params)
    turn_len = getattr(ep.args, "max_turn_response_len", None) or ep.max_response
    # One token of the room is kept for the masked <|im_end|> that closes a cut turn.
    request["max_new_tokens"] = min(turn_len, ep.room() - 1)
    request["stop_token_ids"] = sorted(set(request.get("stop_token_ids") or []) | {ep.stop_id})
    if request.get("sampling_seed") is not None:
        request["sampling_seed"] = (int(request["sampling_seed"]) + 1 + turn) % SEED_MODULUS
    output = await post(
        ep.args.rm_url, {"input_ids": ep.sample.tokens, "sampling_params": request, "return_logprob": True}
    )
    meta_info = output["meta_info"]
    if meta_info["finish_reason"]["type"] == "abort":
        raise TeacherAborted(f"the teacher server aborted turn {turn}")
    ids = [item[1] for item in meta_info.get("output_token_logprobs") or []]
    text = ep.tokenizer.decode([i for i in ids if i != ep.stop_id])
    if not ids or ids[-1] != ep.stop_id:
        ids.append(ep.stop_id)
    ep.sample.append_response_tokens(ep.args, tokens=ids, trainable=False)
    return ids, text


# ---------------------------------------------------------------------------- the teacher's episode
async def play_teacher_episode(ep: Episode, key: str) -> dict:
    """The teacher plays ``ep.sample``'s task from reset in an environment of its own; returns the record.

    ``ep`` is the student's episode (its arguments, sampling parameters and budgets). An environment fault
    propagates (the student's episode fails, nothing is cached), as does an abort.
    """
    args, sample = ep.args, ep.sample
    scratch = Sample(
        index=sample.index,
        group_index=sample.group_index,
        prompt=sample.prompt,
        label=sample.label,
        metadata=copy.deepcopy(sample.metadata),
    )
    teacher = Episode(args, scratch, ep.sampling_params, ep.evaluation)
    params = _teacher_params(ep.sampling_params, key)
    record = {"actions": [], "action_ids": [], "observations": [], "success": False, "end": "max_turns"}
    build_env = load_env_module(args.rollout_interaction_env_path).build_env
    teacher.env = await teacher.env_call(build_env, scratch, args)
    try:
        await _reset(teacher)
        record["prompt_ids"] = list(scratch.tokens)
        for turn in range(int(args.max_turns)):
            if teacher.room() < 2:
                record["end"] = "context_full"
                break
            ids, action = await teacher_turn(teacher, turn, params)
            observation, done = await teacher.step(action)
            record["actions"].append(action)
            record["action_ids"].append(ids)
            record["observations"].append(_message(teacher.env, observation))
            if done:
                record["end"] = "done"
                break
            if not teacher.append_observation(observation):
                record["end"] = "context_full"
                break
    finally:
        if hasattr(teacher.env, "close"):
            # A close that fails or hangs leaves the env in an unknown state: its record is not trusted.
            await teacher.env_call(teacher.env.close)
    record["success"] = bool(teacher.success)
    record["length"] = len(record["actions"])
    record["replayable"] = True  # until a replay shows otherwise
    return record


def usable(record: dict) -> bool:
    """Only a successful teacher episode seeds the student (see the module docstring)."""
    return bool(record.get("success")) and record.get("end") == "done"


# ---------------------------------------------------------------------------- the prefix
async def replay_teacher_prefix(ep: Episode, plan: dict):
    """The B2F prefix from the teacher's episode, into the masked part.

    Returns ``(replayed turns, end)`` as the example's ``Episode.replay_prefix`` does (``end``: None, the student
    plays on; "replay_finished", "context_full" or "aborted") and writes ``prefix_source``
    (``teacher_cached`` / ``teacher_live``), ``prefix_fallback`` and ``teacher_episode_played`` into the
    sample's metadata.
    """
    sample = ep.sample
    if int(plan["depth"]) >= int(ep.args.max_turns):
        # A teacher episode has at most --max-turns turns, so at this depth every prefix is empty:
        # the teacher need not play (at full depth B2F costs what vanilla OPD does).
        return 0, None
    key = task_key(ep.args, sample)
    try:
        record, played = await CACHE.get_or_play(key, lambda: play_teacher_episode(ep, key))
    except TeacherAborted:
        return 0, "aborted"
    sample.metadata["teacher_episode_played"] = played
    if not usable(record):
        sample.metadata["prefix_fallback"] = True
        return 0, None
    prefix = b2f_prefix_length(record["length"], plan["depth"])
    if sample.tokens != record["prompt_ids"]:
        record["replayable"] = False  # a different reset: the recorded actions may not even be legal
    live = not record["replayable"]
    params = _teacher_params(ep.sampling_params, key)

    def source(turns):
        if turns:
            sample.metadata["prefix_source"] = "teacher_live" if live else "teacher_cached"
        return turns

    for i in range(prefix):
        if live:
            if ep.room() < 2:
                return source(i), "context_full"
            try:
                _, action = await teacher_turn(ep, i, params)
            except TeacherAborted:
                return source(i), "aborted"
        else:
            ids, action = record["action_ids"][i], record["actions"][i]
            if len(ids) >= ep.room():  # the student's turn after it needs at least one token
                return source(i), "context_full"
            sample.append_response_tokens(ep.args, tokens=list(ids), trainable=False)
        observation, done = await ep.step(action)
        if not live and _message(ep.env, observation) != record["observations"][i]:
            # The env does not replay what it showed the teacher: the recorded actions no longer fit
            # the state, so the teacher plays the rest live, here and at every later step of this task.
            record["replayable"] = False
            live = True
        if done:
            return source(i + 1), "replay_finished"
        if not ep.append_observation(observation):
            return source(i + 1), "context_full"
    return source(prefix), None


class TeacherPrefixEpisode(Episode):
    """The example's episode, its B2F prefix from the teacher's episode instead of expert actions."""

    async def replay_prefix(self, plan: dict):
        return await replay_teacher_prefix(self, plan)


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """``--custom-generate-function-path`` for ``--tcod-prefix-source teacher``: the example's agent loop
    with B2F prefixes from the teacher's episode."""
    return await play_episode(TeacherPrefixEpisode(args, sample, sampling_params, evaluation))
