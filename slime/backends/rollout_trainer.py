"""The rollout-to-update logic every trainer backend shares: scoring, advantages, PPO / OPD / SFT steps.

A backend (``fsdp_utils.actor.FSDPActor``, ``megatron_utils.actor.MegatronActor``) loads its models and
subclasses :class:`RolloutTrainer`, providing the hooks at the bottom of the class: how a model scores a
micro-batch, how gradients are reduced and clipped, how a loss is back-propagated.

``train(rollout_id, samples, kl_coef)`` takes the WHOLE rollout batch on every rank (the same list, in
the same order). Each data-parallel rank scores and trains only its share (``data_plan``); the per-token
results are all-gathered over the data-parallel group so advantages, the OPD term and whitening are
computed once over the full batch, identically everywhere. That keeps every estimator exact however the
batch is sharded and makes 1 and N processes give the same numbers. Ranks of one tensor-parallel group
share a data-parallel rank and process the same micro-batches.

Each micro-batch loss is already its share of the GLOBAL step loss (``losses``); ``_backward`` scales it
to what the backend's gradient reduction expects (FSDP and our Megatron reduction average over
data-parallel ranks, so both multiply by the data-parallel size to get the sum back).

Non-finite values (teacher log-probs, rewards, advantages, losses, gradient norms) stop the step with a
``guards.NonFiniteError`` before any ``optimizer.step()``.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from slime.backends.fsdp_utils import data_plan, guards, losses
from slime.backends.fsdp_utils.advantages import RolloutTensors, compute_advantages, sample_mean, token_mean_and_seq_sum
from slime.backends.fsdp_utils.gather import all_gather_per_sample, sum_across_ranks
from slime.utils.types import Sample


class RolloutTrainer:
    """Set by the backend's ``__init__``: ``args``, ``device``, ``model``, ``optimizer``, ``ref``, ``teacher``,
    ``critic``, ``critic_optimizer``, ``sft``, ``full_opd``, ``chunk_size``, ``pad_token_id``, ``tokenizer``,
    ``optimizer_steps``, and the data-parallel ``dp_rank`` / ``dp_size`` / ``dp_group`` (None: the world)."""

    dp_group = None

    @staticmethod
    def _load_tokenizer(path):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            return None  # a weights-only folder: checkpoints then carry no tokenizer

    def _pad_id(self, config) -> int:
        for candidate in (getattr(self.tokenizer, "pad_token_id", None), config.pad_token_id,
                          getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(candidate, int):
                return candidate
        return 0  # padded positions are masked out of attention and never read

    def _micro_batches(self, samples: list[Sample], budget_flag: str) -> list[list[int]]:
        """Consecutive index groups for a no-grad pass over ``samples`` on this rank alone."""
        return [list(mb.indices) for mb in data_plan.pack(list(range(len(samples))),
                                                           [len(s.tokens) for s in samples],
                                                           self.args.micro_batch_size, self._budget(budget_flag))]

    def _budget(self, which: str) -> int | None:
        """Token budget per micro-batch (--use-dynamic-batch-size), or None for --micro-batch-size counts."""
        if not getattr(self.args, "use_dynamic_batch_size", False):
            return None
        return self.args.log_probs_max_tokens_per_gpu if which == "log_probs" else self.args.max_tokens_per_gpu

    @torch.no_grad()
    def log_probs(self, samples: list[Sample], which: str = "policy") -> list[torch.Tensor]:
        """Response-span log-probs of ``policy``, ``ref`` or ``teacher`` for ``samples``, all on this rank.

        Runs one forward per micro-batch, so every rank must pass samples that pack into as many.
        """
        model = {"policy": self.model, "ref": self.ref, "teacher": self.teacher}[which]
        if model is None:
            raise ValueError(f"no {which} model is loaded in this trainer")
        out = []
        for group in self._micro_batches(samples, "log_probs"):
            out.extend(t.cpu() for t in self._score(model, [samples[i] for i in group]).log_probs)
        return out

    def _exact_kl_source(self) -> str | None:
        """Where the whole-distribution OPD KL comes from: the in-trainer teacher, the server's top-k, none."""
        if self.sft or not self.args.use_opd:
            return None
        if self.teacher is not None:
            return "full"
        return "topk" if getattr(self.args, "opd_teacher_top_k", 0) else None

    @torch.no_grad()
    def _score_rollout(self, samples, owners, n_steps) -> dict[str, list[torch.Tensor]]:
        """Old-policy, reference, teacher log-probs, critic values and the exact OPD KL (gathered)."""
        args = self.args
        models = {}
        if not args.use_rollout_logprobs:
            models["old"] = self.model
        if self.ref is not None:
            models["ref"] = self.ref
        if self.teacher is not None:
            models["teacher"] = self.teacher
        if self.critic is not None:
            models["values"] = self.critic
        exact = self._exact_kl_source()
        fields = list(models) + (["exact_kl"] if exact else [])
        self.model.eval()
        local: dict[int, list[torch.Tensor]] = defaultdict(list)
        plan = data_plan.plan_forward(len(samples), n_steps, self.dp_size, self.dp_rank, args.micro_batch_size,
                                      lengths=[len(s.tokens) for s in samples],
                                      max_tokens=self._budget("log_probs"))
        for mb in plan:
            batch = [samples[i] for i in mb.indices]
            results = {}
            teacher_lp, kl_teacher = self._kl_teacher(batch) if exact else (None, None)
            for name, model in models.items():
                if name == "values":
                    results[name] = self._values(model, batch)
                elif name == "teacher" and teacher_lp is not None:
                    results[name] = teacher_lp
                elif name == "old" and exact:
                    scores = self._score(model, batch, teacher=kl_teacher)
                    results["old"], results["exact_kl"] = scores.log_probs, scores.kl
                else:
                    results[name] = self._score(model, batch).log_probs
            if exact and "exact_kl" not in results:  # --use-rollout-logprobs: the policy still gives the KL
                results["exact_kl"] = self._score(self.model, batch, teacher=kl_teacher).kl
            del kl_teacher
            scored = [results[f] for f in fields]
            if not mb.dummy:
                for field_scores in scored:
                    for i, score in zip(mb.indices, field_scores):
                        local[i].append(score)
        self.model.train()
        gathered = all_gather_per_sample(local, owners, [s.response_length for s in samples], len(fields),
                                         self.device, self.dp_group) if fields else []
        out = dict(zip(fields, gathered))
        if args.use_rollout_logprobs:
            out["old"] = [self._sample_field(s, "rollout_log_probs", "--use-rollout-logprobs") for s in samples]
        if args.use_opd and args.opd_type == "sglang":
            out["teacher"] = [None if s.teacher_log_probs is None else torch.tensor(s.teacher_log_probs)
                              for s in samples]
        return out

    @staticmethod
    def _engine_logprob_gap(samples, old_log_probs, masks) -> dict:
        """Mean |engine's log-prob - this trainer's| over the trained tokens (upstream slime logs the same
        figure): near 0 while the engines serve the weights being trained, so a weight push that did not reach
        them (rollouts from stale weights) shows up here from the second step on."""
        total, count = 0.0, 0.0
        for sample, old, mask in zip(samples, old_log_probs, masks):
            engine = sample.rollout_log_probs
            if engine is None or len(engine) != len(old):
                continue
            total += float(((torch.tensor(engine, dtype=torch.float32) - old.float()).abs() * mask).sum())
            count += float(mask.sum())
        return {"train/train_rollout_logprob_abs_diff": total / count} if count else {}

    @staticmethod
    def _sample_field(sample, name, flag):
        value = getattr(sample, name)
        if value is None or len(value) != sample.response_length:
            raise ValueError(f"{flag}: sample {sample.index} has no {name} of response length "
                             f"{sample.response_length}")
        return torch.tensor(value, dtype=torch.float32)

    def train(self, rollout_id: int, samples: list[Sample], kl_coef: float) -> dict:
        """One rollout's updates; returns metrics (identical on every rank)."""
        args = self.args
        for sample in samples:
            sample.validate()
        n_steps = args.num_steps_per_rollout
        steps = data_plan.plan_steps(len(samples), n_steps, self.dp_size, self.dp_rank, args.micro_batch_size,
                                     lengths=[len(s.tokens) for s in samples], max_tokens=self._budget("train"))
        owners = data_plan.owners(len(samples), n_steps, self.dp_size)
        masks = [torch.tensor(s.loss_mask if s.loss_mask is not None else [1] * s.response_length,
                              dtype=torch.float32) for s in samples]
        rollout_metrics: dict = {"train/samples": float(len(samples)), "rollout_id": rollout_id}
        per_sample = None
        t0 = time.perf_counter()
        if not self.sft:
            scores = self._score_rollout(samples, owners, n_steps)
            rewards = [s.get_reward_value(args) for s in samples]
            self._check_rollout_inputs(rollout_id, samples, scores, rewards)
            data = RolloutTensors(rewards=rewards, loss_masks=masks,
                                  old_log_probs=scores["old"], ref_log_probs=scores.get("ref"),
                                  teacher_log_probs=scores.get("teacher"), values=scores.get("values"))
            result = compute_advantages(args, data, kl_coef)
            guards.check_per_sample(result.advantages, "advantage", samples, rollout_id)
            guards.check_per_sample(result.returns, "value target (return)", samples, rollout_id)
            per_sample = {"old": data.old_log_probs, "ref": data.ref_log_probs, "adv": result.advantages,
                          "values": data.values, "returns": result.returns}
            rollout_metrics.update(self._rollout_kl_metrics(data, result, masks))
            if not args.use_rollout_logprobs:
                rollout_metrics.update(self._engine_logprob_gap(samples, data.old_log_probs, masks))
            if "exact_kl" in scores:
                rollout_metrics.update(self._exact_kl_metrics(scores["exact_kl"], masks))

        # Sub-timings of this rank (rank 0's are reported): log-prob recomputation (old/ref/teacher/values
        # forwards plus advantages) against the optimiser updates, so a step-time breakdown can split them.
        t1 = time.perf_counter()
        per_step = [self._train_step(samples, step, masks, per_sample, rollout_id, n)
                    for n, step in enumerate(steps)]
        rollout_metrics["time/train_logprobs"] = t1 - t0
        rollout_metrics["time/train_update"] = time.perf_counter() - t1
        metrics = {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
        metrics.update(rollout_metrics)
        metrics["train/num_steps"] = float(len(per_step))
        metrics["per_step"] = per_step
        return metrics

    def _check_rollout_inputs(self, rollout_id, samples, scores, rewards) -> None:
        """Every scored input of the advantages must be finite; the error names its source and sample."""
        server = self.args.use_opd and self.args.opd_type == "sglang"
        sources = {
            "teacher": "teacher reply (server teacher log-probs from --rm-url)" if server
            else "in-trainer teacher log-probs (--opd-teacher-load)",
            "exact_kl": "whole-distribution OPD KL (teacher reply top-k log-probs)" if server
            else "whole-distribution OPD KL (in-trainer teacher)",
            "old": "rollout log-probs (--use-rollout-logprobs)" if self.args.use_rollout_logprobs
            else "policy log-probs",
            "ref": "reference log-probs (--ref-load)",
            "values": "critic values",
        }
        for key, source in sources.items():
            guards.check_per_sample(scores.get(key), source, samples, rollout_id)
        guards.check_rewards(rewards, samples, rollout_id)

    def _rollout_kl_metrics(self, data, result, masks) -> dict:
        trained = [a[m > 0] for a, m in zip(result.advantages, masks)]
        flat = torch.cat(trained) if trained else torch.zeros(0)
        out = {"advantages/mean": float(flat.mean()) if flat.numel() else 0.0,
               "advantages/abs_mean": float(flat.abs().mean()) if flat.numel() else 0.0,
               "advantages/std": float(flat.std()) if flat.numel() > 1 else 0.0}
        if data.ref_log_probs is not None:
            # k1 (the sampled log-ratio) is the KL the controller measures, whatever --kl-loss-type is.
            log_ratio = [old - ref for old, ref in zip(data.old_log_probs, data.ref_log_probs)]
            out["kl/observed_token_mean"], out["kl/observed_seq_sum"] = token_mean_and_seq_sum(log_ratio, masks)
            out["kl/observed_sample_mean"] = sample_mean(log_ratio, masks)
            out["kl/reward_kl_token_mean"] = token_mean_and_seq_sum(result.reward_kl, masks)[0]
        if result.opd_reverse_kl is not None:
            out["opd/reverse_kl"], out["opd/reverse_kl_seq_sum"] = token_mean_and_seq_sum(result.opd_reverse_kl,
                                                                                          masks)
            out["per_sample_opd_kl"] = [kl.tolist() for kl in result.opd_reverse_kl]
        return out

    def _exact_kl_metrics(self, exact_kl, masks) -> dict:
        name = "opd/exact_kl" if self._exact_kl_source() == "full" else "opd/topk_kl"
        token_mean, seq_sum = token_mean_and_seq_sum(exact_kl, masks)
        return {name: token_mean, f"{name}_seq_sum": seq_sum,
                "per_sample_opd_exact_kl": [kl.tolist() for kl in exact_kl]}

    def _train_step(self, samples, step: data_plan.StepPlan, masks, per_sample, rollout_id: int = 0,
                    step_no: int = 0) -> dict:
        args = self.args
        step_masks = [masks[i] for i in step.global_indices]
        agg = losses.make_aggregator(args, step_masks)
        sums: dict[str, float] = defaultdict(float)
        self.model.train()
        for mb in step.micro_batches:
            batch = [samples[i] for i in mb.indices]
            mb_masks = [masks[i].to(self.device) for i in mb.indices]

            def pick(key, mb=mb):
                return None if per_sample[key] is None else [per_sample[key][i].to(self.device) for i in mb.indices]

            # Dummy micro-batches run the teacher too: its forward has FSDP collectives every rank must join.
            teacher = self._kl_teacher(batch)[1] if self.full_opd else None
            scores = self._score(self.model, batch, entropy=not self.sft, teacher=teacher)
            log_probs, entropies = scores.log_probs, scores.entropy
            if mb.dummy:
                loss, mb_metrics = log_probs[0].sum() * 0.0, {}
            elif self.sft:
                loss, mb_metrics = losses.sft_loss(agg, log_probs, mb_masks)
            else:
                loss, mb_metrics = losses.policy_loss(args, agg, log_probs=log_probs, entropies=entropies,
                                                      old_log_probs=pick("old"), advantages=pick("adv"),
                                                      masks=mb_masks, ref_log_probs=pick("ref"))
                if self.full_opd:
                    opd_loss = agg(scores.kl, mb_masks)
                    loss = loss + args.opd_kl_coef * opd_loss
                    mb_metrics["opd/full_kl_loss"] = float(opd_loss.detach())
                    mb_metrics["loss"] = float(loss.detach())
            self._backward(loss)
            if self.critic is not None:
                new_values = self._values(self.critic, batch)
                if mb.dummy:
                    vloss, v_metrics = new_values[0].sum() * 0.0, {}
                else:
                    vloss, v_metrics = losses.value_loss(args, agg, values=new_values, old_values=pick("values"),
                                                         returns=pick("returns"), masks=mb_masks)
                self._backward(vloss)
                mb_metrics.update(v_metrics)
            for key, value in mb_metrics.items():
                sums[key] += value
        # Every rank must report the same keys for the all-reduce, including ranks with only dummies.
        keys = ["loss"] if self.sft else ["loss", "pg_loss", "pg_clipfrac", "entropy", "ppo_kl"] + \
            (["kl_loss"] if args.use_kl_loss else []) + (["opd/full_kl_loss"] if self.full_opd else []) + \
            (["critic/value_loss", "critic/value_clipfrac"] if self.critic is not None else [])
        metrics = sum_across_ranks({k: sums.get(k, 0.0) for k in keys}, self.device, self.dp_group)
        pairs = [(self.model, self.optimizer, "grad_norm")]
        if self.critic is not None:
            pairs.append((self.critic, self.critic_optimizer, "critic/grad_norm"))
        try:
            # Both checks before either optimizer steps: a NaN critic must not leave a half-updated pair.
            guards.check_step(metrics, rollout_id, step_no, "loss")
            for model, _, _ in pairs:
                self._reduce_grads(model)
            norms = {name: self._clip_grads(model) for model, _, name in pairs}
            guards.check_step(norms, rollout_id, step_no, "gradient norm")
        except guards.NonFiniteError:
            for _, optimizer, _ in pairs:  # a caller that goes on must not add to these gradients
                optimizer.zero_grad(set_to_none=True)
            raise
        for _, optimizer, _ in pairs:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        metrics.update(norms)
        self.optimizer_steps += 1
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["train/tokens"] = float(sum(float(m.sum()) for m in step_masks))
        return metrics

    # ------------------------------------------------------------------ backend hooks
    def _score(self, model, batch, *, entropy=False, teacher=None):
        """``forward.Scores`` of ``model`` on a micro-batch (gradients flow outside ``torch.no_grad``)."""
        raise NotImplementedError

    def _kl_teacher(self, batch):
        """``(in-trainer teacher log-probs or None, what the student's whole-distribution KL is taken against)``."""
        raise NotImplementedError

    def _values(self, critic, batch):
        raise NotImplementedError(f"{type(self).__name__} has no critic")

    def _backward(self, loss) -> None:
        (loss * self.dp_size).backward()

    def _reduce_grads(self, model) -> None:
        """Make gradients final before clipping (FSDP reduces them during backward: nothing to do)."""

    def _clip_grads(self, model) -> float:
        """Clip to ``--clip-grad`` (0 = off) and return the global norm (the same on every rank)."""
        raise NotImplementedError
