"""RolloutManager: the data source, the inference engines and the rollout function of a run.

It starts ``--rollout-backend`` engine servers (the project's hf_engine on CPU, real SGLang on GPUs)
unless slime's router address is given, runs the rollout function for each step, drops samples that
cannot be trained on (failed episodes, B2F replays that finished the task), and pushes new weights to
the engines with ``/update_weights_from_disk``.
"""

from __future__ import annotations

import copy
import logging

from slime.utils.data import Dataset, RolloutDataSource
from slime.utils.misc import load_function
from slime.utils.types import Status

logger = logging.getLogger(__name__)


class TooManyFailures(RuntimeError):
    """Most of a rollout batch failed: training on what is left would be training on nothing."""


def trainable(sample) -> bool:
    if sample.status in (Status.FAILED, Status.ABORTED):
        return False
    if sample.metadata.get("no_training_sample"):
        return False
    return sample.response_length > 0 and (sample.loss_mask is None or sum(sample.loss_mask) > 0)


def select_trainable(args, groups) -> tuple[list, dict]:
    """Flatten groups, keeping only trainable samples; group estimators drop whole incomplete groups."""
    group_estimator = args.advantage_estimator in ("grpo", "gspo", "reinforce_plus_plus_baseline") \
        and args.n_samples_per_prompt > 1
    kept, dropped, failed = [], 0, 0
    for group in groups:
        ok = [trainable(s) for s in group]
        failed += sum(s.status == Status.FAILED for s in group)
        if group_estimator and not all(ok):
            dropped += len(group)
            continue
        kept.extend(s for s, good in zip(group, ok) if good)
        dropped += len(group) - sum(ok)
    total = sum(len(g) for g in groups)
    if failed and failed * 2 > total:
        reasons = sorted({str(s.metadata.get("error", "?"))[:200] for g in groups for s in g
                          if s.status == Status.FAILED})[:3]
        raise TooManyFailures(f"{failed} of {total} samples failed in this rollout (e.g. {reasons}); "
                              "stopping instead of training on what is left")
    return kept, {"rollout/failed": failed, "rollout/dropped": dropped, "rollout/kept": len(kept)}


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
                                           apply_chat_template=args.apply_chat_template)
        self.generate_rollout = load_function(args.rollout_function_path)
        self.engines = []
        if not args.sglang_router_ip:
            self._start_engines()

    # ------------------------------------------------------------------ engines
    def _start_engines(self):
        from slime.backends.sglang_utils.launcher import launch_engine

        args = self.args
        count = max(1, (args.rollout_num_gpus or 1) // max(1, args.rollout_num_gpus_per_engine))
        model_path = getattr(args, "rollout_model_path", None) or args.hf_checkpoint
        for i in range(count):
            self.engines.append(launch_engine(args, model_path, engine_index=i))
        args.rollout_engine_urls = [engine.url for engine in self.engines]
        logger.info("rollout engines ready: %s", args.rollout_engine_urls)

    def update_weights(self, hf_path: str) -> None:
        from slime.backends.sglang_utils.launcher import update_weights_from_disk

        for url in self.args.rollout_engine_urls or []:
            update_weights_from_disk(url, hf_path)

    def shutdown(self):
        for engine in self.engines:
            engine.stop()
        self.engines = []

    # ------------------------------------------------------------------ rollouts
    def generate(self, rollout_id: int):
        groups = self.generate_rollout(self.args, rollout_id, self.data_source, evaluation=False)
        samples, stats = select_trainable(self.args, groups)
        return samples, groups, stats

    def last_timings(self) -> dict:
        """Phase timings of the last rollout, when the rollout function records them."""
        from slime.rollout import sglang_rollout

        return dict(sglang_rollout.LAST_TIMINGS)

    def evaluate(self, rollout_id: int) -> dict:
        """Full episodes on every eval set; returns mean reward (and success) per set."""
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
            flat = [s for g in groups for s in g]
            rewards = [s.metadata.get("task_reward", 0.0) for s in flat]
            metrics[f"eval/{name}/reward"] = sum(rewards) / max(1, len(rewards))
            successes = [s.metadata["success"] for s in flat if "success" in s.metadata]
            if successes:
                metrics[f"eval/{name}/success_rate"] = sum(map(float, successes)) / len(successes)
        return metrics
