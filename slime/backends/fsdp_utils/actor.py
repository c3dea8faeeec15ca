"""The per-process FSDP2 trainer: policy, optional reference / in-trainer teacher / critic, PPO updates.

One ``FSDPActor`` lives in each trainer process of one torch.distributed group (set up by
``launch.init_distributed``, a Ray actor in ``slime/ray/actor_group.py`` or a spawned process).

``train(rollout_id, samples, kl_coef)`` takes the WHOLE rollout batch on every rank (the same list, in
the same order). Each rank scores and trains only its share (``data_plan``); the per-token results are
all-gathered so advantages, the OPD term and whitening are computed once over the full batch,
identically on every rank. That keeps every estimator exact however the batch is sharded (groups
never need to stay on one rank) and makes 1 and N processes give the same numbers.

FSDP2 averages gradients over ranks. Each micro-batch loss is already its share of the GLOBAL step
loss (``losses``), so it is multiplied by the world size before ``backward`` to turn that average
back into the sum.

Non-finite values (teacher log-probs, rewards, advantages, losses, gradient norms) stop the step with a
``guards.NonFiniteError`` before any ``optimizer.step()``.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist

from slime.backends.fsdp_utils import checkpoint, data_plan, forward, guards, losses, model_io
from slime.backends.fsdp_utils.advantages import RolloutTensors, compute_advantages, token_mean_and_seq_sum
from slime.backends.fsdp_utils.gather import all_gather_per_sample, sum_across_ranks
from slime.utils import teacher_vocab
from slime.utils.arguments import needs_reference
from slime.utils.types import Sample


def _adamw(params, args, lr):
    return torch.optim.AdamW(params, lr=lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                             weight_decay=args.weight_decay)


class FSDPActor:
    def __init__(self, args, rank: int, world_size: int):
        if not dist.is_initialized():
            raise RuntimeError("FSDPActor needs torch.distributed initialised (launch.init_distributed or "
                               "launch.ensure_single_process_group)")
        self.args, self.rank, self.world_size = args, rank, world_size
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else \
            torch.device("cpu")
        self.mesh = model_io.make_mesh(world_size)
        self.sft = args.loss_type == "sft_loss"
        self.tokenizer = self._load_tokenizer(args.hf_checkpoint)

        # --log-probs-chunk-size: positions per LM-head chunk (forward.py); <= 0 takes whole rows.
        self.chunk_size = getattr(args, "log_probs_chunk_size", -1)
        policy = model_io.load_causal_lm(args.hf_checkpoint, "--hf-checkpoint")
        self.vocab_size = policy.config.vocab_size
        self.pad_token_id = self._pad_id(policy.config)
        if getattr(args, "gradient_checkpointing", False):
            model_io.enable_activation_checkpointing(policy)
        self.model = model_io.shard(policy, self.mesh, model_io.decoder_layers(policy))
        self.optimizer = _adamw(self.model.parameters(), args, args.lr)
        self.optimizer_steps = 0
        # --opd-loss full: the whole-distribution reverse KL is a loss term instead of slime's sampled reward.
        self.full_opd = not self.sft and args.use_opd and getattr(args, "opd_loss", "sampled") == "full"

        self.ref = None
        if not self.sft and needs_reference(args):
            self.ref = self._load_frozen(args.ref_load or args.hf_checkpoint, "--ref-load")
        self.teacher = None
        if not self.sft and args.use_opd and args.opd_type == "megatron":
            self.teacher = self._load_frozen(args.opd_teacher_load, "--opd-teacher-load")
        self.critic = self.critic_optimizer = None
        if not self.sft and args.advantage_estimator == "ppo":
            from slime.backends.fsdp_utils.critic import load_value_model

            critic = load_value_model(args.critic_load or args.hf_checkpoint,
                                      "--critic-load" if args.critic_load else "--hf-checkpoint")
            if getattr(args, "gradient_checkpointing", False):
                model_io.enable_activation_checkpointing(critic.backbone)
            self.critic = model_io.shard(critic, self.mesh, model_io.decoder_layers(critic.backbone))
            self.critic_optimizer = _adamw(self.critic.parameters(), args, args.critic_lr or args.lr)

    # ------------------------------------------------------------------ setup helpers
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

    def _load_frozen(self, path, flag):
        model = model_io.load_causal_lm(path, flag)
        # Model vocabulary sizes, and tokenizers where both folders have one (a same-size but permuted
        # tokenizer would score other tokens than the policy sampled).
        teacher_vocab.check_local_vocab(self.args.hf_checkpoint, path, flag,
                                        policy_vocab=self.tokenizer.get_vocab() if self.tokenizer else None)
        return model_io.shard(model_io.frozen(model), self.mesh, model_io.decoder_layers(model), frozen=True)

    # ------------------------------------------------------------------ scoring
    def _score(self, model, batch, *, entropy=False, teacher=None) -> forward.Scores:
        return forward.score(model, batch, temperature=self.args.rollout_temperature, pad_token_id=self.pad_token_id,
                             device=self.device, chunk_size=self.chunk_size, entropy=entropy, teacher=teacher)

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

    def _kl_teacher(self, batch):
        """``(in-trainer teacher log-probs or None, what the student's whole-distribution KL is taken against)``."""
        if self.teacher is not None:
            return forward.teacher_for_kl(self.teacher, batch, temperature=self.args.rollout_temperature,
                                          pad_token_id=self.pad_token_id, device=self.device,
                                          chunk_size=self.chunk_size)
        return None, forward.topk_teacher(batch, self.device)

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
        plan = data_plan.plan_forward(len(samples), n_steps, self.world_size, self.rank, args.micro_batch_size,
                                      lengths=[len(s.tokens) for s in samples],
                                      max_tokens=self._budget("log_probs"))
        for mb in plan:
            batch = [samples[i] for i in mb.indices]
            results = {}
            teacher_lp, kl_teacher = self._kl_teacher(batch) if exact else (None, None)
            for name, model in models.items():
                if name == "values":
                    results[name] = forward.values(model, batch, pad_token_id=self.pad_token_id, device=self.device)
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
                                         self.device) if fields else []
        out = dict(zip(fields, gathered))
        if args.use_rollout_logprobs:
            out["old"] = [self._sample_field(s, "rollout_log_probs", "--use-rollout-logprobs") for s in samples]
        if args.use_opd and args.opd_type == "sglang":
            out["teacher"] = [None if s.teacher_log_probs is None else torch.tensor(s.teacher_log_probs)
                              for s in samples]
        return out

    @staticmethod
    def _sample_field(sample, name, flag):
        value = getattr(sample, name)
        if value is None or len(value) != sample.response_length:
            raise ValueError(f"{flag}: sample {sample.index} has no {name} of response length "
                             f"{sample.response_length}")
        return torch.tensor(value, dtype=torch.float32)

    # ------------------------------------------------------------------ training
    def train(self, rollout_id: int, samples: list[Sample], kl_coef: float) -> dict:
        """One rollout's updates; returns metrics (identical on every rank)."""
        args = self.args
        for sample in samples:
            sample.validate()
        n_steps = args.num_steps_per_rollout
        steps = data_plan.plan_steps(len(samples), n_steps, self.world_size, self.rank, args.micro_batch_size,
                                     lengths=[len(s.tokens) for s in samples], max_tokens=self._budget("train"))
        owners = data_plan.owners(len(samples), n_steps, self.world_size)
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
            (loss * self.world_size).backward()
            if self.critic is not None:
                new_values = forward.values(self.critic, batch, pad_token_id=self.pad_token_id, device=self.device)
                if mb.dummy:
                    vloss, v_metrics = new_values[0].sum() * 0.0, {}
                else:
                    vloss, v_metrics = losses.value_loss(args, agg, values=new_values, old_values=pick("values"),
                                                         returns=pick("returns"), masks=mb_masks)
                (vloss * self.world_size).backward()
                mb_metrics.update(v_metrics)
            for key, value in mb_metrics.items():
                sums[key] += value
        # Every rank must report the same keys for the all-reduce, including ranks with only dummies.
        keys = ["loss"] if self.sft else ["loss", "pg_loss", "pg_clipfrac", "entropy", "ppo_kl"] + \
            (["kl_loss"] if args.use_kl_loss else []) + (["opd/full_kl_loss"] if self.full_opd else []) + \
            (["critic/value_loss", "critic/value_clipfrac"] if self.critic is not None else [])
        metrics = sum_across_ranks({k: sums.get(k, 0.0) for k in keys}, self.device)
        pairs = [(self.model, self.optimizer, "grad_norm")]
        if self.critic is not None:
            pairs.append((self.critic, self.critic_optimizer, "critic/grad_norm"))
        try:
            # Both checks before either optimizer steps: a NaN critic must not leave a half-updated pair.
            guards.check_step(metrics, rollout_id, step_no, "loss")
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

    def _clip_grads(self, model) -> float:
        """Clip to ``--clip-grad`` (0 = off) and return the global norm (the same on every rank)."""
        max_norm = self.args.clip_grad if self.args.clip_grad and self.args.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(norm)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str) -> None:
        checkpoint.save(self, path)

    def load(self, path: str) -> None:
        checkpoint.load(self, path)

    def export_hf(self, path: str) -> None:
        checkpoint.export_hf(self, path)
