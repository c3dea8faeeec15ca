"""Continuous batching on a worker thread, so the aiohttp event loop never waits on the model.

Work arrives in FIFO order. Each loop turn the worker (1) runs every waiting score-only request
(``max_new_tokens: 0``) in as few batched forwards as the token budget allows, (2) prefills waiting
generation requests as one group and merges them into the running batch (up to ``max_batch_size``
rows), (3) decodes one token for every running row. Rows leave the batch as soon as they finish. This
module decides what runs together and when; what a request holds, when it stops and how it is
answered across threads live in ``jobs``.

``load()`` counts what SGLang's ``/v1/loads`` counts: rows being decoded (running) and requests received
but not yet decoding (waiting: queued, being scored or prefilled). Every job is counted from
``submit`` until it is answered or dropped, so the count reaches 0 exactly when the engine is idle.

A weight update is a barrier in the queue: requests that arrived before it finish on the old weights
(the worker stops admitting and drains the running batch first); requests after it see the new ones.
Replies carry the ``weight_version`` in effect when answered. ``hold()`` / ``release()`` are SGLang's in-place
pause: no forward runs (rows keep their KV), but aborts are answered and barriers run at once, even with
rows running, as SGLang updates a paused engine without waiting.

Finished generations leave their KV in a prefix cache (``prefix_cache``) so a later request that
starts with the same tokens (the next turn of an agent, another sample of the same prompt) prefills
only what is new. The cache is cleared with every weight update: old weights' KV would be wrong.

``deterministic=True`` (``--enable-deterministic-inference``) makes a request's result independent of
timing: each row runs its own forward (``row_runner``) and is sampled alone, a request without a seed
gets the server's ``--random-seed`` (not the next draw of a stream shared in arrival order), and the
prefix cache is off: whether an entry is there depends on what finished first, and reused KV (from
other forwards' shapes) differs from a fresh prefill in the last bits.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque

import torch

from slime.backends.hf_engine.jobs import Barrier, Job, finish_reason, id_lists, keep_input_logprobs, resolve
from slime.backends.hf_engine.protocol import GenerateRequest
from slime.backends.hf_engine.response import finish_abort, finish_length
from slime.backends.hf_engine.prefix_cache import PrefixCache
from slime.backends.hf_engine.row_runner import RowRunner
from slime.backends.hf_engine.sampling import make_generator, sample_next, sample_rows

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, runner, *, max_batch_size: int = 64, max_prefill_tokens: int = 16384,
                 batch_wait_s: float = 0.002, seed: int = 0, prefix_cache_bytes: int = 0,
                 deterministic: bool = False):
        self.deterministic = deterministic
        if deterministic and prefix_cache_bytes:
            logger.info("deterministic inference: the prefix cache is off")
            prefix_cache_bytes = 0
        self.runner = RowRunner(runner) if deterministic else runner
        self._sample = sample_rows if deterministic else sample_next
        self.default_seed = seed
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.batch_wait_s = batch_wait_s
        self._seeds = random.Random(seed)  # seeds requests that bring none
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: deque = deque()
        self._running: list[Job] = []
        self._batch = None
        self._last_tokens = torch.empty(0, dtype=torch.long)
        # Jobs taken off the queue in this step that are neither running nor answered yet: if the step
        # fails, they are answered with the error too instead of waiting forever.
        self._in_hand: list[Job] = []
        self._unanswered = 0  # jobs submitted and not yet settled
        self._count_lock = threading.Lock()
        self._stopped = False
        self._held = False  # pause_generation(mode="in_place"): no forward runs until release()
        self.weight_version = "default"  # SGLang's --weight-version default; set by weight updates
        self._thread = threading.Thread(target=self._loop, name="hf-engine-worker", daemon=True)

    # ------------------------------------------------------------------ called from the event loop
    def start(self):
        self._thread.start()

    def stop(self):
        self._stopped = True
        self._inbox.put(None)
        self._thread.join(timeout=10)

    def submit(self, req: GenerateRequest, loop, future) -> None:
        seed = req.sampling.seed
        if seed is None:  # a stream drawn in arrival order would make the seed depend on timing
            seed = self.default_seed if self.deterministic else self._seeds.getrandbits(63)
        with self._count_lock:
            self._unanswered += 1
        self._inbox.put(Job(req, loop, future, make_generator(seed)))

    def submit_update_weights(self, model_path: str, loop, future, weight_version: str | None = None) -> None:
        """Load ``model_path``'s weights; on success ``weight_version`` (if given) is what replies carry."""
        payload = {"model_path": model_path, "weight_version": weight_version}
        self._inbox.put(Barrier("update_weights", payload, loop, future))

    def hold(self, loop, future) -> None:  # ``future`` completes once the worker has stopped stepping
        self._inbox.put(("hold", (loop, future)))

    def release(self) -> None:
        self._inbox.put(("release", None))

    def submit_flush_cache(self, loop, future) -> None:
        """Drop the prefix cache: a barrier, so requests that arrived before it may still use it."""
        self._inbox.put(Barrier("flush_cache", {}, loop, future))

    def abort(self, rid: str | None) -> None:
        """Abort one request by rid, or every request when rid is None."""
        self._inbox.put(("abort", rid))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def load(self) -> tuple[int, int]:
        """``(running, waiting)``: rows in the decode batch, and the other requests not yet answered."""
        with self._count_lock:
            unanswered = self._unanswered
        # Read from the event loop while the worker moves rows: a row may finish (and be settled) a
        # moment before it leaves the running list, so running is capped by what is unanswered.
        running = min(len(self._running), unanswered)
        return running, unanswered - running

    # ------------------------------------------------------------------ worker thread
    def _drain(self, block: bool) -> None:
        items = []
        if block:
            items.append(self._inbox.get())
            # Concurrent clients arrive a few hundred microseconds apart: wait while they keep coming (at
            # most batch_wait_s apart, 10 x batch_wait_s in all) so one forward takes them all instead of
            # starting with a batch of one.
            last_deadline = time.perf_counter() + 10 * self.batch_wait_s
            while True:
                wait = min(self.batch_wait_s, last_deadline - time.perf_counter())
                if wait <= 0:
                    break
                try:
                    items.append(self._inbox.get(timeout=wait))
                except queue.Empty:
                    break
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if item is None:
                continue
            if isinstance(item, tuple) and item[0] == "abort":
                self._mark_aborted(item[1])
            elif isinstance(item, tuple) and item[0] == "hold":
                self._held = True
                resolve(*item[1], True)
            elif isinstance(item, tuple) and item[0] == "release":
                self._held = False
            else:
                self._waiting.append(item)

    def _mark_aborted(self, rid):
        for job in list(self._waiting) + self._running:
            if isinstance(job, Job) and (rid is None or job.req.rid == rid):
                job.abort_message = "aborted by /abort_request"

    def _loop(self):
        while not self._stopped:
            try:
                self._drain(block=self._held or (not self._running and not self._waiting))
                if self._stopped:
                    break
                self._step()
            except Exception as err:  # keep serving: fail the requests involved, not the server
                logger.exception("engine step failed")
                self._fail_all(err)

    def _fail_all(self, err):
        # By identity: a job taken this step may already be running too (dataclasses do not hash).
        for job in {id(j): j for j in self._running + self._in_hand}.values():
            if not job.settled:
                resolve(job.loop, job.future, error=err)
                self._settle(job)
        self._running, self._batch, self._in_hand = [], None, []
        self._last_tokens = torch.empty(0, dtype=torch.long)

    def _take(self, jobs) -> None:
        """Take jobs off the queue; they are in hand until they run or are answered."""
        for job in jobs:
            self._waiting.remove(job)
        self._in_hand.extend(jobs)

    def _settle(self, job) -> None:
        """A job leaves the engine (answered, failed or dropped): it is counted no more."""
        if job.settled:
            return
        job.settled = True
        with self._count_lock:
            self._unanswered -= 1

    def _step(self):
        # Answer aborted waiting jobs right away; they never reach the model.
        for job in [j for j in self._waiting if isinstance(j, Job) and j.abort_message]:
            self._waiting.remove(job)
            job.result.finish_reason = finish_abort(job.abort_message)
            self._reply(job)
        if self._held:
            self._step_held()
            return
        if self._waiting and isinstance(self._waiting[0], Barrier):
            if not self._running:
                self._run_barrier(self._waiting.popleft())
                return
        else:
            segment = []
            for item in self._waiting:
                if isinstance(item, Barrier):
                    break
                segment.append(item)
            self._run_scoring([j for j in segment if j.req.score_only])
            self._admit([j for j in segment if not j.req.score_only])
        if self._running:
            self._decode_step()
        self._in_hand = []  # the step went through: each taken job is running or answered

    def _step_held(self):
        """Paused in place: barriers run now, in order; jobs wait; aborted running rows are answered."""
        for barrier in [b for b in self._waiting if isinstance(b, Barrier)]:
            self._waiting.remove(barrier)
            self._run_barrier(barrier)
        for job in [j for j in self._running if j.abort_message]:
            job.result.finish_reason = finish_abort(job.abort_message)
            self._reply(job)
        self._keep_running([i for i, job in enumerate(self._running) if not job.abort_message])
        self._in_hand = []

    def _run_barrier(self, barrier: Barrier):
        if barrier.kind == "flush_cache":
            self.prefix_cache.clear()
            resolve(barrier.loop, barrier.future, {"success": True})
            return
        path, version = barrier.payload["model_path"], barrier.payload.get("weight_version")
        self.prefix_cache.clear()  # KV computed with the old weights must not meet the new ones
        try:
            self.runner.load_weights(path)
        except Exception as err:  # the weights are unchanged: load_weights checks before it copies
            reply = {"success": False, "message": f"Failed to update weights from {path}: {err}"}
        else:
            message = "Succeeded to update model weights."
            if version is not None:
                self.weight_version = version
                message += f" Weight version updated to {version}."
            reply = {"success": True, "message": message}
        reply["num_paused_requests"] = 0
        resolve(barrier.loop, barrier.future, reply)

    def _budget_groups(self, jobs, cost):
        """Split jobs into groups whose padded token count stays within the prefill budget."""
        group, longest = [], 0
        for job in jobs:
            c = cost(job)
            if group and max(longest, c) * (len(group) + 1) > self.max_prefill_tokens:
                yield group
                group, longest = [], 0
            group.append(job)
            longest = max(longest, c)
        if group:
            yield group

    def _run_scoring(self, jobs):
        self._take(jobs)
        # Shortest first: rows of similar length share a forward, so a burst of mixed lengths (per-turn
        # teacher examples, trajectories of different horizons) pads far less. Replies go per job.
        jobs = sorted(jobs, key=lambda j: len(j.req.input_ids))
        for group in self._budget_groups(jobs, lambda j: len(j.req.input_ids)):
            logger.debug("scoring %d request(s) in one forward", len(group))
            spans = self.runner.score([j.req.input_ids for j in group], [j.req.logprob_start_len for j in group],
                                      [j.req.top_k_logprobs for j in group], **id_lists(group))
            for job, span in zip(group, spans):
                if job.req.return_logprob:
                    keep_input_logprobs(job.result, span)
                job.result.finish_reason = finish_length(0)
                self._reply(job)

    def _admit(self, jobs):
        room = self.max_batch_size - len(self._running)
        jobs = jobs[:max(0, room)]
        if not jobs:
            return
        self._take(jobs)
        prefixes = {id(job): self._reusable_prefix(job) for job in jobs}
        cost = lambda j: len(j.req.input_ids) - prefixes[id(j)][0]  # noqa: E731 - tokens actually fed
        for group in self._budget_groups(jobs, cost):
            starts = [j.req.logprob_start_len if j.req.return_logprob else None for j in group]
            batch, logits, spans = self.runner.prefill([j.req.input_ids for j in group], starts,
                                                       [prefixes[id(j)] for j in group],
                                                       [j.req.top_k_logprobs for j in group], **id_lists(group))
            for job, span in zip(group, spans):
                if span is not None:
                    keep_input_logprobs(job.result, span)
            tokens, keep = self._advance(group, logits, batch)
            if not keep:
                continue
            batch.keep(keep)
            new_jobs = [group[i] for i in keep]
            new_tokens = tokens[keep]
            if self._batch is None:
                self._batch, self._running, self._last_tokens = batch, new_jobs, new_tokens
            else:
                self._batch.merge(batch)
                self._running = self._running + new_jobs
                self._last_tokens = torch.cat([self._last_tokens, new_tokens])

    def _reusable_prefix(self, job: Job):
        """``(n, entry)``: how many leading input tokens the prefix cache can supply, and from where."""
        if not self.prefix_cache.enabled:
            return 0, None
        ids = job.req.input_ids
        # The last input token is always fed; input log-probs (and their top-k, over the same positions)
        # need the logits from their start on, which cached KV does not give.
        limit = len(ids) - 1
        if job.req.return_logprob:
            limit = min(limit, job.req.logprob_start_len)
        return self.prefix_cache.lookup(ids, limit)

    def _remember(self, job: Job, batch, row: int) -> None:
        """Store a finished row's KV: its input and every output token but the last (never fed)."""
        if not self.prefix_cache.enabled:
            return
        tokens = list(job.req.input_ids) + job.result.output_ids[:-1]
        layers = self.runner.row_kv(batch, row)
        if layers and layers[0][0].shape[1] == len(tokens):
            self.prefix_cache.insert(tokens, layers)
        else:  # never expected; a mismatch must not poison later requests
            logger.warning("prefix cache: row has %s KV columns for %d tokens; not stored",
                           layers[0][0].shape[1] if layers else 0, len(tokens))

    def _decode_step(self):
        logits = self.runner.decode(self._batch, self._last_tokens)
        tokens, keep = self._advance(self._running, logits, self._batch)
        self._last_tokens = tokens
        self._keep_running(keep)

    def _keep_running(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` of the running batch (the others have been answered or dropped)."""
        if len(keep) == len(self._running):
            return
        if keep:
            self._batch.keep(keep)
            self._running = [self._running[i] for i in keep]
            self._last_tokens = self._last_tokens[keep]
        else:
            self._running, self._batch = [], None
            self._last_tokens = torch.empty(0, dtype=torch.long)

    def _advance(self, jobs, logits, batch):
        """Sample one token for each job's row of ``batch``; finish the jobs that are done.

        Returns (tokens, kept rows). Finished rows are stored in the prefix cache first.
        """
        extra = id_lists(jobs)
        tokens, logprobs, tops, *asked = self._sample(logits, [j.req.sampling for j in jobs],
                                                      [j.generator for j in jobs], [j.req.top_k_logprobs for j in jobs],
                                                      **extra)
        asked = asked[0] if asked else [None] * len(jobs)
        keep = []
        for i, job in enumerate(jobs):
            if job.future.cancelled():
                self._settle(job)
                continue  # the client went away: drop the row silently
            if job.abort_message:
                job.result.finish_reason = finish_abort(job.abort_message)
                self._reply(job)
                continue
            token = int(tokens[i])
            job.result.output_ids.append(token)
            job.result.output_logprobs.append(float(logprobs[i]))
            if tops[i] is not None:
                job.result.output_top_logprobs.append(tops[i])
            if asked[i] is not None:
                job.result.output_token_ids_logprobs.append(asked[i])
            finish = finish_reason(job, token, self.runner)
            if finish is None:
                keep.append(i)
            else:
                job.result.finish_reason = finish
                self._remember(job, batch, i)
                self._reply(job)
        return tokens, keep

    def _reply(self, job: Job):
        job.result.latency_s = time.perf_counter() - job.started
        job.result.weight_version = self.weight_version
        resolve(job.loop, job.future, job.result)
        self._settle(job)
