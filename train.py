"""Entry point, as in slime: parse -> start/join Ray -> trainer group + rollout manager -> loop.

    python train.py --hf-checkpoint MODEL --prompt-data data.jsonl --num-rollout 10 ... [--dry-run]

Each step n: rollout (generate, teacher scoring / rewards) -> train (log-probs, advantages, OPD term,
PPO update) -> KL-controller update -> push weights to the engines (rollouts of step n+1 use the
weights of step n) -> evaluation when due -> metrics row -> checkpoint on schedule. The row is written
before the checkpoint, so a checkpoint of step n always has its row; on resume, rows after the
checkpoint are dropped (MetricsLogger) and those steps run again. Inputs are checked before Ray or any
engine starts (``slime.launch``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from slime.utils.arguments import parse_args
from slime.utils.misc import heartbeat

CHECKING = "train.py: still checking the inputs; nothing is started yet"


def _say(line: str) -> None:
    print(f"train.py: {line}", file=sys.stderr, flush=True)


def _init_ray(args):
    """Join the cluster --ray-address / RAY_ADDRESS names, else start a local Ray of this run's own.

    ``address="local"``: a bare ``ray.init()`` joins whatever ``ray start`` registered on this machine (live or
    long gone) and then refuses ``num_cpus``; a run without an address never joins by accident."""
    import ray

    from slime.ray.local_ray import join_with_token, registered_cluster

    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    start = time.monotonic()
    # Ray announces its default, token authentication, with a WARNING that would read as a problem.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if address:
        _say(f"joining the Ray cluster at {address} ({'--ray-address' if args.ray_address else 'RAY_ADDRESS'})")
        join_with_token()
        ray.init(address=address, ignore_reinit_error=True)
    else:
        world = args.actor_num_nodes * args.actor_num_gpus_per_node
        cpus = max(2, world + 1)
        live = registered_cluster()
        beside = f"; the Ray cluster `ray start` runs at {live} is not joined (--ray-address {live} joins it)" \
            if live else ""
        _say(f"starting a local Ray for this run ({cpus} CPUs){beside}")
        # Its workers inherit this environment: with this checkout on PYTHONPATH they import it without a
        # runtime_env of their own (slime.ray.actor_group.trainer_runtime_env).
        root = str(Path(__file__).resolve().parent)
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, *paths) if p)
        with heartbeat("train.py: still starting Ray"):
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, ignore_reinit_error=True,
                     log_to_driver=True, logging_level=logging.WARNING)
    _say(f"Ray up in {time.monotonic() - start:.0f} s")


def _due(step: int, interval: int | None, last: int) -> bool:
    return bool(interval) and ((step + 1) % interval == 0 or step == last)


class _BarSafeLines:
    """A stream for ``print`` that writes each line with ``tqdm.write``, so the lines go above the progress bar
    instead of onto its end."""

    def write(self, text: str) -> None:
        from tqdm import tqdm

        if text.strip():  # print writes its end ("\n") separately
            tqdm.write(text.rstrip("\n"), file=sys.stderr)

    def flush(self) -> None:
        sys.stderr.flush()


def _evaluate(rollout_manager, rollout_id: int) -> dict:
    """The evaluation, announced, with a heartbeat and its result: it can last as long as several training steps
    while the progress bar stands still (the demo's 96 held-out episodes: about 50 s at step 39 of 40)."""
    from tqdm import tqdm

    when = "before training" if rollout_id < 0 else f"after step {rollout_id}"
    sets = ", ".join(f"{name} ({len(dataset.samples)} tasks)" for name, dataset in rollout_manager.eval_sets.items())
    tqdm.write(f"train.py: evaluating {when}: {sets}", file=sys.stderr)
    started = time.monotonic()
    with heartbeat(f"train.py: still evaluating {when}", stream=_BarSafeLines()):
        metrics = rollout_manager.evaluate(rollout_id)
    # Rounded for the reader; metrics.jsonl keeps every digit.
    results = "".join(f", {key.split('/')[1]} success {value:.2f}" for key, value in metrics.items()
                      if key.endswith("/success_rate"))
    tqdm.write(f"train.py: evaluated {when} in {time.monotonic() - started:.0f} s{results}", file=sys.stderr)
    return metrics


def _update_kl_controller(args, kl_ctrl, train_stats: dict, n_samples: int) -> dict:
    """Feed the batch's policy-vs-reference KL, in the ``--kl-ctrl-unit`` unit, to the adaptive controller
    (``kl_ctrl`` None: ``--kl-ctrl fixed``, nothing to feed)."""
    if kl_ctrl is None:
        return {"kl_ctrl/coef": args.kl_coef}
    unit_key = "kl/observed_seq_sum" if args.kl_ctrl_unit == "sequence" else "kl/observed_sample_mean"
    observed = train_stats.get(unit_key)
    if observed is None:
        # Defaulting to 0 would drive the coefficient down every step without saying why.
        raise RuntimeError(f"the trainer returned no {unit_key!r}; the adaptive KL controller needs the "
                           "reference model's log-probs")
    return kl_ctrl.update(observed, n_steps=max(1, n_samples))


@contextlib.contextmanager
def weight_sync_dir(args):
    """Where the policy is exported for the engines: ``{save}/weight_sync``, or without ``--save`` a temporary
    folder removed at exit however the run ends (it holds a full policy copy)."""
    if args.save:
        yield Path(args.save) / "weight_sync"
        return
    root = tempfile.mkdtemp(prefix="slime-sync-")
    try:
        yield Path(root) / "weight_sync"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _one_line_warnings() -> None:
    """This runtime's own warnings print as one line, as its errors do; other packages' keep their format."""
    import warnings

    default, root = warnings.formatwarning, str(Path(__file__).resolve().parent / "slime")

    def one_line(message, category, filename, lineno, line=None):
        if str(filename).startswith(root):
            return f"train.py: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = one_line


def main(argv=None) -> int:
    _one_line_warnings()
    args = parse_args(argv=argv)  # no torch yet: a mistyped flag is answered at once
    with heartbeat(CHECKING):
        from slime.launch.prepare import prepare_run  # torch, transformers: seconds, more on a busy machine

    # Everything before Ray (checks, --dry-run's plan, output folders and their lock, preflight). A refusal or
    # the plan ends the run here with its exit code; the lock is held until the run ends.
    with prepare_run(args) as prepared:
        if prepared.exit_code is not None:
            return prepared.exit_code
        return _launch(args, prepared.inputs)


def _launch(args, inputs) -> int:
    """The run after its checks: Ray, the loop; returns the exit code."""
    from slime.ray.local_ray import LocalRay
    from slime.ray.run_summary import RunProgress, first_sigint_stops

    # The command line owns the local Ray it starts and stops it; in-process callers (tests) share one.
    owns_ray = __name__ == "__main__" and not (args.ray_address or os.environ.get("RAY_ADDRESS"))
    local_ray = LocalRay() if owns_ray else None
    progress = RunProgress(args.num_rollout, checkpoint=inputs.load_folder)
    status, code = "failed", 1
    with first_sigint_stops() as sigint:
        try:
            with sigint.deferred():
                _init_ray(args)
            if local_ray is not None:
                local_ray.record()
            with weight_sync_dir(args) as sync_dir:
                _run(args, inputs, sync_dir, progress, local_ray)
            status, code = "done", 0
        except KeyboardInterrupt:
            if not progress.told_interrupt:  # Ctrl-C while Ray was starting
                progress.tell_interrupt()
            status, code = "interrupted", 130
        except SystemExit:  # a SIGTERM: Ray's handler in the driver exits through it
            status = "stopped"
            raise
        except Exception as err:  # noqa: BLE001 - known failures get a paragraph; the rest keep their traceback
            from slime.ray.failures import describe_failure

            message = describe_failure(args, err)
            if message is None and __name__ != "__main__":
                raise  # in-process callers (tests) get the exception itself
            if message is None:
                import traceback

                traceback.print_exc()  # here, not at exit: the summary line comes after it
            else:
                print(f"train.py: error: {message}", file=sys.stderr)
        finally:
            sigint.ignore()  # the stop below runs to its end, then the summary line
            if local_ray is not None:
                local_ray.stop()
            print(f"train.py: {progress.summary(status)}", file=sys.stderr, flush=True)
    return code


def custom_rollout_log(args, rollout_id: int, groups, rollout_time: float) -> dict:
    """Upstream's ``--custom-rollout-log-function-path`` hook on the step's samples; returns what it added."""
    if not args.custom_rollout_log_function_path:
        return {}
    from slime.utils.misc import load_function

    extra: dict = {}
    flat = [s for group in groups for s in (group if isinstance(group, list) else [group])]
    load_function(args.custom_rollout_log_function_path)(rollout_id, args, flat, extra, rollout_time)
    return extra


def _run(args, inputs, sync_dir: Path, progress=None, local_ray=None) -> None:
    """The run itself; ``progress`` (a ``RunProgress``) follows its steps and checkpoints for the summary line.

    Ctrl-C anywhere in it prints one line, then the engines and trainers are stopped as after any error."""
    from tqdm import tqdm

    from slime.checkpoint.driver import load_checkpoint, save_checkpoint
    from slime.ray.actor_group import TrainerGroup
    from slime.ray.rollout import RolloutManager
    from slime.ray.run_summary import RunProgress, bar_fields
    from slime.rollout import debug_rollout_data, teacher_prefix
    from slime.rollout.empty_steps import EmptySteps
    from slime.rollout.trainable_samples import trainable
    from slime.utils.kl_controller import build_kl_controller
    from slime.utils.metrics import MetricsLogger
    from slime.utils.step_metrics import rollout_metrics

    progress = progress or RunProgress(args.num_rollout)
    kl_ctrl = build_kl_controller(args) if args.kl_ctrl == "adaptive" else None
    rollout_manager = trainer = bar = None
    empty_steps = EmptySteps(args, trainable)
    start = 0
    try:
        # Engine processes load while the trainer group starts; we wait for them after.
        started = time.monotonic()
        tqdm.write(f"train.py: starting {args.actor_num_nodes * args.actor_num_gpus_per_node} trainer process(es) "
                   "and the rollout engine(s); each loads the model", file=sys.stderr)
        with heartbeat("train.py: still starting the trainer and the rollout engine(s)"):
            rollout_manager = RolloutManager(args, inputs.tokenizer)
            trainer = TrainerGroup(args)
            if inputs.load_folder is not None:
                state = load_checkpoint(inputs.load_folder, trainer=trainer, data_source=rollout_manager.data_source,
                                        kl_controller=kl_ctrl, teacher_episodes=teacher_prefix.CACHE,
                                        verify=False)  # verified by preflight
                start = state["rollout_id"] + 1
            rollout_manager.wait_engines()
        tqdm.write(f"train.py: trainer and rollout engine(s) ready in {time.monotonic() - started:.0f} s",
                   file=sys.stderr)
        if rollout_manager.needs_engines and rollout_manager.engines_are_external():
            # The workers of the user's router serve whatever they last loaded (another run's weights, or a
            # checkpoint other than the one resumed): give them this run's before its first rollout, as upstream
            # slime does. Engines started here loaded this run's model already.
            trainer.export_hf(str(sync_dir))
            rollout_manager.update_weights(str(sync_dir))
        if local_ray is not None:
            local_ray.record()  # the trainer actors' worker processes, now that they run
        # Resuming from step 0 (a --load that holds no checkpoint yet) runs the evaluation before training again.
        logger = MetricsLogger(args, resume_step=(start or -1) if args.load else None)
        progress.metrics = logger.path
        last = args.num_rollout - 1

        if args.eval_interval and start == 0 and rollout_manager.eval_sets and not args.skip_eval_before_train:
            logger.log(-1, _evaluate(rollout_manager, -1))
        bar = tqdm(range(start, args.num_rollout), desc="train", initial=start, total=args.num_rollout,
                   dynamic_ncols=True)
        # A step's checkpoint is written after its row, so its duration is reported in the next row
        # ("time/save") and counted in that row's "time/step", which runs from one row to the next.
        t_step, t_save = time.perf_counter(), 0.0
        for rollout_id in bar:
            progress.started(rollout_id)
            t0 = time.perf_counter()
            samples, groups, select_stats = rollout_manager.generate(rollout_id)
            debug_rollout_data.save(args.save_debug_rollout_data, samples, rollout_id)
            t_rollout = time.perf_counter() - t0

            t0 = time.perf_counter()
            coef_used = args.kl_coef if kl_ctrl is None else kl_ctrl.value
            eval_due = _due(rollout_id, args.eval_interval, last) and bool(rollout_manager.eval_sets)
            train_stats, kl_stats, t_sync = {}, {}, 0.0
            if samples:
                empty_steps.trained()
                train_stats = trainer.train(rollout_id, samples, coef_used)
            else:  # every sample removed: one line, a metrics row, no update (several in a row stop the run)
                line, train_stats = empty_steps.skip(rollout_id, groups)
                tqdm.write(f"train.py: {line}", file=sys.stderr)
            t_train = time.perf_counter() - t0

            if samples:
                kl_stats = _update_kl_controller(args, kl_ctrl, train_stats, len(samples))
                t0 = time.perf_counter()
                # SFT runs use their engines only to evaluate: push weights just before an evaluation.
                if rollout_manager.needs_engines and (args.loss_type != "sft_loss" or eval_due):
                    trainer.export_hf(str(sync_dir))
                    rollout_manager.update_weights(str(sync_dir))
                t_sync = time.perf_counter() - t0

            # kl_ctrl/coef: the coefficient this step's rewards used (the PR's meaning); adaptive adds next_coef.
            metrics = {**rollout_metrics(args, groups, samples, train_stats), **select_stats,
                       **{k: v for k, v in train_stats.items() if not k.startswith("per_sample_")},
                       "kl_ctrl/coef": coef_used, **kl_stats}
            metrics.update(custom_rollout_log(args, rollout_id, groups, t_rollout))
            if eval_due:
                metrics.update(_evaluate(rollout_manager, rollout_id))
            timings = {"time/rollout": t_rollout, "time/train": t_train, "time/save": t_save,
                       "time/weight_sync": t_sync, "time/step": time.perf_counter() - t_step}
            timings.update(rollout_manager.last_timings())
            metrics.update(timings)
            logger.log(rollout_id, metrics)  # fsynced: durable before the checkpoint that marks the step done
            progress.logged(rollout_id)
            empty_steps.stop_if_too_many()  # after the row: the last skipped step is recorded too
            bar.set_postfix(bar_fields(args, metrics))

            t_step = time.perf_counter()
            if args.save and _due(rollout_id, args.save_interval, last):
                progress.saved(save_checkpoint(args.save, rollout_id, trainer=trainer,
                                               data_source=rollout_manager.data_source, kl_controller=kl_ctrl,
                                               teacher_episodes=teacher_prefix.CACHE))
            t_save = time.perf_counter() - t_step
        logger.close()
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()  # the bar's last line, before ours
        progress.tell_interrupt()
        raise
    finally:
        if bar is not None:
            bar.close()  # now, not at garbage collection after the summary line
        if rollout_manager is not None:
            rollout_manager.shutdown()
        if trainer is not None:
            trainer.shutdown()


if __name__ == "__main__":
    sys.exit(main())
