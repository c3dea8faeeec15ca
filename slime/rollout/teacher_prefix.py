"""B2F prefixes from the teacher's own episode (``--tcod-prefix-source teacher``), no expert data needed.

The TCOD proposal seeds the student with the first ``L - k(n)`` turns of the teacher's episode, ``L``
being that episode's length. So, per task:

1. The teacher server (``--rm-url``) plays the whole episode once, in an environment of its own, from
   reset until done or ``--max-turns``. Its actions, token ids and observations are kept in
   :data:`CACHE`, keyed by the task's identity and ``--rollout-seed`` (the teacher is frozen, so the
   episode would come out the same anyway; the cache saves the teacher's turns at every later step).
2. Each B2F episode replays the first ``max(0, L - k(n))`` recorded turns into the student's own
   environment: every action is executed again with ``env.step`` and the teacher's token ids go into
   the prompt part, masked from training like an expert prefix.
3. An environment that does not replay deterministically is found out by comparing each observation
   with the recorded one. From the first difference on, and for that task at every later step, the
   teacher plays the prefix live in the student's environment (same length ``L - k(n)``).

A task the teacher fails (no success before done, ``--max-turns`` or a full context) falls back to
vanilla OPD: prefix 0, the student plays the whole episode. Seeding the student with a failing path
would teach it to start from the teacher's mistakes. Such samples are counted in
``tcod/prefix_fallback``. The failure is cached too: a frozen teacher would fail again.

The cache is a JSON-able ``state_dict``: a runtime that checkpoints it resumes exactly; upstream's
checkpoints do not hold it, so there it lives as long as the rollout process.
"""

import asyncio
import copy
import hashlib
import json

from examples.multi_turn_tcod.chat_layout import encode_observation, encode_prompt
from examples.multi_turn_tcod.env_adapter import close_env
from examples.multi_turn_tcod.rollout import Episode, request_room

from slime.utils.types import Sample

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
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % (2**31 - 1)


class TeacherEpisodeCache:
    """Teacher episodes by :func:`task_key`; each entry is a plain dict (JSON-able, see ``_record``)."""

    def __init__(self):
        self.entries: dict[str, dict] = {}
        self._pending: dict[str, asyncio.Future] = {}  # keys whose episode is being played right now

    def state_dict(self) -> dict:
        return {"version": 1, "entries": copy.deepcopy(self.entries)}

    def load_state_dict(self, state: dict | None) -> None:
        """Replace the cache with a saved one (``None``: a checkpoint without teacher episodes: empty)."""
        if state is not None and state.get("version") != 1:
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


# ---------------------------------------------------------------------------- the teacher's episode
def teacher_room(ep) -> int:
    """Tokens a teacher turn may ask for: the sequence's room and the teacher server's own context."""
    limit = request_room(ep.args, len(ep.sample.tokens), "teacher")
    return ep.room() if limit is None else min(ep.room(), limit)


def _teacher_params(sampling_params: dict, key: str) -> dict:
    params = dict(sampling_params)
    if params.get("sampling_seed") is not None:  # seeded only where the student is (deterministic engines)
        params["sampling_seed"] = teacher_seed(key)
    return params


async def play_teacher_episode(ep, sample: Sample, sampling_params: dict, key: str) -> dict:
    """The teacher plays ``sample``'s task from reset in an environment of its own; returns the record.

    ``ep`` is the student's ``rollout.Episode`` (its limits, tokenizer and env timeout). An environment
    fault propagates (the student's episode fails, nothing is cached).
    """
    scratch = Sample(
        index=sample.index,
        group_index=sample.group_index,
        prompt=sample.prompt,
        label=sample.label,
        metadata=copy.deepcopy(sample.metadata),
    )
    teacher = Episode(ep.args, scratch, ep.tokenizer, ep.evaluation)
    params = _teacher_params(sampling_params, key)
    env = await teacher.build_env("build (teacher episode)")
    record = {"actions": [], "action_ids": [], "observations": [], "success": False, "end": "max_turns"}
    try:
        observation = await teacher.env_call(env, "reset()", env.reset)
        record["observations"].append(observation)
        scratch.tokens = list(encode_prompt(ep.tokenizer, observation))
        for turn in range(int(ep.args.max_turns)):
            room = teacher_room(teacher)
            if room <= 0:
                record["end"] = "context_full"
                break
            out = await teacher.sample_turn(ep.args.rm_url, turn, params, salt=_TEACHER_SALT, room=room)
            ids = list(out["output_ids"])
            action = teacher.action_text(ids)
            observation, reward, done, info = await teacher.env_call(env, "step()", env.step, action)
            teacher.record_step(reward, info or {})
            record["actions"].append(action)
            record["action_ids"].append(ids)
            record["observations"].append(observation)
            if done:
                record["end"] = "done"
                break
            scratch.tokens.extend(ids)
            scratch.tokens.extend(encode_observation(ep.tokenizer, observation))
    finally:
        hung = await close_env(env, ep.env_timeout, scratch)
    if hung is not None:  # an env whose close hangs is in an unknown state: do not trust what it recorded
        raise hung
    record["success"] = bool(teacher.success)
    record["length"] = len(record["actions"])
    record["replayable"] = True  # until a replay shows otherwise
    return record


def usable(record: dict) -> bool:
    """Only a successful teacher episode seeds the student (see the module docstring)."""
    return bool(record.get("success")) and record.get("end") == "done"


# ---------------------------------------------------------------------------- the prefix
async def replay_teacher_prefix(ep, env, plan: dict, observation: str, sampling_params: dict):
    """Play the B2F prefix from the teacher's episode into the prompt part of ``ep.sample``.

    Returns ``(observation, end, turns)`` like the expert replay and writes ``prefix_source``
    (``teacher_cached`` / ``teacher_live`` / None), ``prefix_fallback`` and ``teacher_episode_played``
    into the sample's metadata.
    """
    sample = ep.sample
    if int(plan["depth"]) >= int(ep.args.max_turns):
        # A teacher episode has at most --max-turns turns, so at this depth every prefix is empty:
        # the teacher need not play (at full depth B2F costs what vanilla OPD does).
        return observation, None, 0
    key = task_key(ep.args, sample)
    record, played = await CACHE.get_or_play(key, lambda: play_teacher_episode(ep, sample, sampling_params, key))
    sample.metadata["teacher_episode_played"] = played
    if not usable(record):
        sample.metadata["prefix_fallback"] = True
        return observation, None, 0
    prefix = max(0, record["length"] - int(plan["depth"]))
    if observation != record["observations"][0]:
        record["replayable"] = False  # a different reset: the recorded actions may not even be legal
    live = not record["replayable"]
    params = _teacher_params(sampling_params, key)
    for i in range(prefix):
        if live:
            room = teacher_room(ep)
            if room <= 0:
                return observation, "context_full", i
            out = await ep.sample_turn(ep.args.rm_url, i, params, salt=_TEACHER_SALT, room=room)
            ids = list(out["output_ids"])
            action = ep.action_text(ids)
        else:
            ids, action = list(record["action_ids"][i]), record["actions"][i]
        observation, reward, done, info = await ep.env_call(env, "step()", env.step, action)
        ep.record_step(reward, info or {})
        sample.tokens.extend(ids)
        if not live and observation != record["observations"][i + 1]:
            # The env does not replay what it showed the teacher: the recorded actions no longer fit
            # the state, so the teacher plays the rest live, here and at every later step of this task.
            record["replayable"] = False
            live = True
        if done:
            sample.metadata["prefix_source"] = "teacher_live" if live else "teacher_cached"
            return observation, "replay_finished", i + 1
        sample.tokens.extend(encode_observation(ep.tokenizer, observation))
    if prefix:
        sample.metadata["prefix_source"] = "teacher_live" if live else "teacher_cached"
    return observation, None, prefix
