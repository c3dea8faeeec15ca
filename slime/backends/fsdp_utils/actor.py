"""The per-process FSDP2 trainer: policy, optional reference / in-trainer teacher / critic.

One ``FSDPActor`` lives in each trainer process of one torch.distributed group (set up by
``launch.init_distributed``, a Ray actor in ``slime/ray/actor_group.py`` or a spawned process). It loads
HF models, shards them with FSDP2 (``model_io``) and provides the hooks of
``slime.backends.rollout_trainer.RolloutTrainer``, which holds the rollout -> update logic shared with the
Megatron backend: ``train(rollout_id, samples, kl_coef)``, ``log_probs``.

FSDP2 averages gradients over ranks during backward; every rank is its own data-parallel rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from slime.backends import teacher_vocab
from slime.backends.fsdp_utils import checkpoint, forward, model_io
from slime.backends.rollout_trainer import RolloutTrainer
from slime.utils.arguments import needs_reference


def _adamw(params, args, lr):
    return torch.optim.AdamW(params, lr=lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                             weight_decay=args.weight_decay)


class FSDPActor(RolloutTrainer):
    def __init__(self, args, rank: int, world_size: int):
        if not dist.is_initialized():
            raise RuntimeError("FSDPActor needs torch.distributed initialised (launch.init_distributed or "
                               "launch.ensure_single_process_group)")
        self.args, self.rank, self.world_size = args, rank, world_size
        self.dp_rank, self.dp_size = rank, world_size  # FSDP: every rank is its own data-parallel rank
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
    def _load_frozen(self, path, flag):
        model = model_io.load_causal_lm(path, flag)
        # Model vocabulary sizes, and tokenizers where both folders have one (a same-size but permuted
        # tokenizer would score other tokens than the policy sampled).
        teacher_vocab.check_local_vocab(self.args.hf_checkpoint, path, flag,
                                        policy_vocab=self.tokenizer.get_vocab() if self.tokenizer else None)
        return model_io.shard(model_io.frozen(model), self.mesh, model_io.decoder_layers(model), frozen=True)

    # ------------------------------------------------------------------ backend hooks (rollout_trainer)
    def _score(self, model, batch, *, entropy=False, teacher=None) -> forward.Scores:
        return forward.score(model, batch, temperature=self.args.rollout_temperature, pad_token_id=self.pad_token_id,
                             device=self.device, chunk_size=self.chunk_size, entropy=entropy, teacher=teacher)

    def _kl_teacher(self, batch):
        if self.teacher is not None:
            return forward.teacher_for_kl(self.teacher, batch, temperature=self.args.rollout_temperature,
                                          pad_token_id=self.pad_token_id, device=self.device,
                                          chunk_size=self.chunk_size)
        return None, forward.topk_teacher(batch, self.device)

    def _values(self, critic, batch):
        return forward.values(critic, batch, pad_token_id=self.pad_token_id, device=self.device)

    def _clip_grads(self, model) -> float:
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
