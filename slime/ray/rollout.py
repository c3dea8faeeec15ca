"""RolloutManager: the data source, the inference engines and the rollout function of a run.

It starts ``--rollout-backend`` engine servers (the project's hf_engine on CPU, real SGLang on GPUs)
unless slime's router address is given, runs the rollout function for each step, drops samples that
cannot be trained on (failed and aborted episodes, B2F replays that finished the task), and pushes new
weights to the engines with ``/update_weights_from_disk``.

Generate functions reach the engines the way upstream's do, through ``--sglang-router-ip`` /
``--sglang-router-port``: for engines started here those two are pointed at the one engine, or at an
sglang-router started in front of several once they are healthy (``sglang_utils.router``), and
``args.sglang_router_external`` records that the address is the runtime's, not the user's.

With ``--rollout-backend sglang`` on a Ray cluster with GPUs, the engines run on GPUs that Ray reserves
for them (``engine_placement``), so they never share devices with the trainer; elsewhere (the
hf_engine, a Ray without GPUs) they are child processes of this one.

Behind slime's router (``--sglang-router-ip``) the engines are the router's workers (``GET /workers``),
asked again at every weight push; a router that lists none stops the run instead of training on while
the engines keep the old weights. Once the engines are up, their length limits (and the teacher
server's) are read from ``/server_info`` into ``args.engine_limits`` and carried into upstream's
``--rollout-max-context-len`` / ``--eval-max-context-len``, so requests are cut to fit (``engine_info``),
and engines that ignore sampling seeds are reported.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from pathlib import Path

from slime.rollout.sample_hooks import set_current_rollout_id
from slime.rollout.trainable_samples import select_trainable
from slime.utils.data import Dataset, RolloutDataSource
from slime.utils.step_metrics import turns_without_stop_fraction, warn_if_turns_cut
from slime.utils.misc import load_function
from slime.utils.types import Status

logger = logging.getLogger(__name__)


class RolloutManager:
    def __init__(self, args, tokenizer=None):
        self.args = args
        self.tokenizer = tokenizer
        self.data_source = RolloutDataSource.from_args(args, tokenizer) if args.prompt_data else None
        self.eval_sets = {}
        pairs = args.eval_prompt_data or []
        for name, path in zip(pairs[0::2], pairs[1::2]):
            self.eval_sets[name] = Dataset(path, input_key=args.input_key, label_key=args.label_key,
                                           metadata_key=args.metadata_key, tokenizer=tokenizer,
                                           apply_chat_template=args.apply_chat_template,
                                           apply_chat_template_kwargs=args.apply_chat_template_kwargs)
        self.generate_rollout = load_function(args.rollout_function_path)
        self.engines = []
        self._engine_group = None  # Ray placement group holding the engines' GPUs, when there is one
        self._router = None  # the sglang-router in front of several engines started here
        # SFT on expert data needs no engine unless it evaluates by playing episodes.
        self.needs_engines = args.loss_type != "sft_loss" or bool(self.eval_sets)
        from slime.backends.sglang_utils.router import uses_external_router

        # Decided before _start_engines points the router flags at engines of its own; args a former
        # manager pointed so (sglang_router_external False) start their engines again.
        if uses_external_router(args):
            args.sglang_router_external = True
        elif self.needs_engines:
            try:
                self._start_engines()
            except BaseException:  # Ctrl-C or a failed launch: the engines started so far are stopped
                self.shutdown()
                raise

    # ------------------------------------------------------------------ engines
    def _start_engines(self):
        """Start the engine processes without waiting: they load while the trainer group starts."""
        from slime.backends.sglang_utils.launcher import EngineProcess, build_engine_command, find_free_port

        args = self.args
        count = max(1, (args.rollout_num_gpus or 1) // max(1, args.rollout_num_gpus_per_engine))
        model_path = getattr(args, "rollout_model_path", None) or args.hf_checkpoint
        log_dir = Path(os.environ.get("SLIME_ENGINE_LOG_DIR", "/tmp/slime_engines"))
        if args.rollout_backend == "sglang":
            from slime.ray import engine_placement

            if engine_placement.ray_gpus():
                self.engines, self._engine_group = engine_placement.start_engines_in_ray(
                    args, count, model_path, str(log_dir))
                self._route_to_engines()
                return
            from slime.backends.sglang_utils.launcher import cuda_present

            if cuda_present():
                logger.warning("Ray reports no GPUs: the SGLang engines are pinned by --base-gpu-id to devices "
                               "0..%d of this process, which nothing keeps the trainer off",
                               count * args.rollout_num_gpus_per_engine - 1)
            else:
                logger.info("no CUDA device: the SGLang engines run on the CPU (SGLang's CPU settings)")
        def start_local(i: int) -> EngineProcess:
            port = find_free_port(args.engine_host)
            cmd = build_engine_command(args, model_path=model_path, host=args.engine_host, port=port,
                                       base_gpu_id=i * args.rollout_num_gpus_per_engine)
            return EngineProcess(cmd, host=args.engine_host, port=port,
                                 log_path=log_dir / f"engine_{args.engine_host}_{port}.log")

        self._start_local = start_local
        self.engines = [start_local(i) for i in range(count)]
        self._route_to_engines()

    def _route_to_engines(self) -> None:
        """Point upstream's router flags at the engines just started (their ports are known before they load)."""
        from slime.backends.sglang_utils.router import point_router_at_engines

        self._router = point_router_at_engines(self.args, [engine.url for engine in self.engines])

    def wait_engines(self, timeout: float = 600.0) -> None:
        from slime.backends.sglang_utils.launcher import PORT_RACE_TRIES, EngineLaunchError, lost_its_port

        moved = False
        for i in range(len(self.engines)):
            for attempt in range(1, PORT_RACE_TRIES + 1):
                try:
                    self.engines[i].wait_healthy(timeout)
                    break
                except EngineLaunchError:
                    # A port picked free is released before the server binds it, so another process can take
                    # it first: start that engine again on a new port (engines started in Ray are not retried).
                    restart = getattr(self, "_start_local", None)
                    if restart is None or attempt == PORT_RACE_TRIES or not lost_its_port(self.engines[i]):
                        raise
                    logger.warning("rollout engine %s lost its port to another process; starting it on a new one",
                                   self.engines[i].url)
                    self.engines[i].stop()
                    self.engines[i], moved = restart(i), True
        if moved:
            if self._router is not None:
                self._router.stop()
            self._route_to_engines()
        router = getattr(self, "_router", None)
        if router is not None and router.process is None:
            router.start()  # after the engines: it checks its workers' health as it starts
        if self.engines:
            logger.info("rollout engines ready: %s", self.args.rollout_engine_urls)
        if self.needs_engines:
            from slime.rollout.sglang_rollout import run_async

            run_async(self._read_engine_limits())

    def engines_are_external(self) -> bool:
        """The engines are the workers of the user's ``--sglang-router-ip`` router, not started here."""
        from slime.backends.sglang_utils.router import uses_external_router

        return uses_external_router(self.args)

    def engine_urls(self) -> list[str]:
        """Base URLs of the rollout engines: the ones started here, else the user's router's workers."""
        from slime.backends.sglang_utils.router import uses_external_router

        if not uses_external_router(self.args):
            return list(getattr(self.args, "rollout_engine_urls", None) or [])
        from slime.backends.sglang_utils.engine_info import require_router_workers
        from slime.rollout.sglang_rollout import run_async

        return run_async(require_router_workers(self.args))

    async def _read_engine_limits(self) -> None:
        """``args.engine_limits`` from the engines' (and the teacher's) ``/server_info``, carried into the
        context-length flags; warn about seeds."""
        from slime.backends.sglang_utils import engine_info
        from slime.backends.sglang_utils.router import uses_external_router

        args = self.args
        urls = await engine_info.require_router_workers(args) if uses_external_router(args) \
            else list(getattr(args, "rollout_engine_urls", None) or [])
        limits = {}
        try:
            rollout = engine_info.combine([await engine_info.read_limits(url, args.hf_checkpoint) for url in urls])
        except (RuntimeError, OSError) as err:  # HTTPRequestError is a RuntimeError
            logger.warning("could not read the rollout engines' limits (%s): requests are not cut to their "
                           "context, and an over-long one fails with HTTP 400", err)
        else:
            limits["rollout"] = rollout.as_dict()
            engine_info.warn_if_seeds_ignored("rollout engine(s)", urls, rollout)
        teacher_url = getattr(args, "rm_url", None)
        if teacher_url and (getattr(args, "opd_type", None) == "sglang"
                            or getattr(args, "tcod_prefix_source", None) == "teacher"):
            try:
                info = await engine_info.get_server_info(teacher_url)
                folder = info.get("model_path") if isinstance(info.get("model_path"), str) else None
                teacher = engine_info.limits_from_server_info(info, engine_info.model_context_length(folder))
            except (RuntimeError, OSError) as err:
                logger.warning("could not read the teacher server's limits at %s (%s): sequences are not "
                               "cut to what it can score", teacher_url, err)
            else:
                limits["teacher"] = teacher.as_dict()
                if getattr(args, "tcod_prefix_source", None) == "teacher":  # the teacher samples B2F turns
                    engine_info.warn_if_seeds_ignored("teacher server", [teacher_url], teacher)
        args.engine_limits = limits
        if limits:
            logger.info("engine limits: %s", limits)
        # The agent loop bounds sequences by upstream's flags only: they must carry what the servers take.
        for change in engine_info.clamp_context_flags(args, limits):
            logger.info("engine limits -> %s", change)

    def update_weights(self, hf_path: str) -> None:
        if not self.needs_engines:
            return
        from slime.backends.sglang_utils.weights import update_weights_from_disk
        from slime.rollout.sglang_rollout import run_async

        urls = self.engine_urls()
        if not urls:  # nobody would get the new weights: rollouts would silently go off-policy
            raise RuntimeError("no rollout engine to push weights to")

        async def push_all():
            await asyncio.gather(*(update_weights_from_disk(url, hf_path) for url in urls))

        try:
            run_async(push_all())
        except Exception as err:
            self.check_engines(err)
            raise
        logger.debug("weights from %s pushed to %d engine(s)", hf_path, len(urls))

    def shutdown(self):
        """Stop the router, the engines, their GPU reservation and the HTTP session, each whatever the others do.

        Never raises (a failure is logged): it runs after the error or Ctrl-C that stopped the run, which is
        the one to report, and every later piece must still be stopped."""
        from slime.rollout.sglang_rollout import run_async
        from slime.utils.http_utils import close_session

        router, self._router = getattr(self, "_router", None), None
        engines, self.engines = self.engines, []
        group, self._engine_group = self._engine_group, None
        steps = [("router", router.stop if router is not None else None)]
        steps += [(f"engine {engine.url}", engine.stop) for engine in engines]
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            steps.append(("engine placement group", lambda: remove_placement_group(group)))
        steps.append(("HTTP session", lambda: run_async(close_session())))
        for name, stop in steps:
            if stop is None:
                continue
            try:
                stop()
            except Exception as err:  # noqa: BLE001 - see the docstring
                logger.warning("stopping the %s failed: %r", name, err)

    # ------------------------------------------------------------------ rollouts
    def check_engines(self, err: BaseException | None = None) -> None:
        """Raise ``EngineDiedError`` (its log tail quoted) when an engine started here has exited, chained to
        ``err``, the failure it explains; a request to a dead engine otherwise fails only after its retries."""
        from slime.backends.sglang_utils.launcher import dead_engines

        died = dead_engines(self.engines)
        if died is not None:
            raise died from err

    def generate(self, rollout_id: int):
        set_current_rollout_id(rollout_id)  # read by the agent loop's curriculum, as upstream keeps it
        from slime.rollout import sglang_rollout

        sglang_rollout.LAST_COUNTS.clear()
        self.check_engines()
        try:
            groups = self.generate_rollout(self.args, rollout_id, self.data_source, evaluation=False)
        except Exception as err:
            self.check_engines(err)
            raise
        samples, stats = select_trainable(self.args, groups)
        # --turns-per-step: how many waves of episodes the step drew (its episodes and turns: rollout_metrics).
        stats.update({k: v for k, v in sglang_rollout.LAST_COUNTS.items() if k == "rollout/waves"})
        return samples, groups, stats

    def last_timings(self) -> dict:
        """Phase timings of the last rollout, when the rollout function records them."""
        from slime.rollout import sglang_rollout

        return dict(sglang_rollout.LAST_TIMINGS)

    def evaluate(self, rollout_id: int) -> dict:
        """Full episodes on every eval set; returns mean reward (and success) per set."""
        set_current_rollout_id(rollout_id)
        metrics = {}
        for name, dataset in self.eval_sets.items():
            groups = []
            index = 10**9  # eval sample indices never collide with training ones (seeds stay distinct)
            for g, template in enumerate(dataset.samples):
                group = []
                for _ in range(self.args.n_samples_per_eval_prompt):
                    sample = copy.deepcopy(template)
                    sample.group_index, sample.index = g, index
                    index += 1
                    group.append(sample)
                groups.append(group)
            groups = self.generate_rollout(self.args, rollout_id, groups, evaluation=True)
            # An aborted episode stopped early for the run's sake: its return says nothing of the policy.
            flat = [s for g in groups for s in g if s.status != Status.ABORTED]
            aborted = sum(len(g) for g in groups) - len(flat)
            if aborted:
                metrics[f"eval/{name}/aborted"] = aborted
            rewards = [s.metadata.get("task_reward", 0.0) for s in flat]
            metrics[f"eval/{name}/reward"] = sum(rewards) / max(1, len(rewards))
            successes = [s.metadata["success"] for s in flat if "success" in s.metadata]
            if successes:
                metrics[f"eval/{name}/success_rate"] = sum(map(float, successes)) / len(successes)
            cut = turns_without_stop_fraction(flat)
            if cut is not None:
                metrics[f"eval/{name}/turns_without_stop"] = cut
                warn_if_turns_cut(self.args, cut, f"evaluation on {name}")
        return metrics
