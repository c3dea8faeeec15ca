"""The per-process Megatron-core trainer (``--train-backend megatron``): same interface as ``FSDPActor``.

Each trainer process holds one tensor-parallel shard of a ``GPTModel`` (``model.build_gpt``) built from
``--hf-checkpoint``'s config and filled from its weights (``hf_weights``); ranks are laid out by
Megatron's parallel state (``--tensor-model-parallel-size``; the rest is data parallel). The rollout ->
update logic is ``RolloutTrainer``'s, shared with the FSDP backend; this class provides its hooks:

* scoring through ``megatron_utils.forward`` (the decoder, then the shared chunked LM head);
* gradients: averaged over the data-parallel group by one flat all-reduce after the micro-batches
  (Megatron's DDP buffers assume CUDA); replicated parameters whose gradient is a per-rank share (q/k
  norms, and every norm with sequence parallelism) are summed over the tensor-parallel group;
* the global gradient norm counts tensor-parallel shards once each and replicated parameters once;
* ``torch.optim.AdamW`` over the float32 local shards: element-wise, so sharding does not change it.

The reference model and an in-trainer teacher (``--opd-type megatron``) are frozen ``GPTModel`` s with
the same tensor-parallel layout, loaded from a HF folder or a Megatron checkpoint root
(``weight_sources``). A critic (``--advantage-estimator ppo``) is not implemented on this backend.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import torch.distributed as dist

from slime.arguments.megatron_shape import shape_mismatches
from slime.backends import teacher_vocab
from slime.backends.fsdp_utils.forward import topk_teacher
from slime.backends.megatron_utils import checkpoint, forward, hf_weights, weight_sources
from slime.backends.megatron_utils.model import build_gpt, init_parallel
from slime.backends.rollout_trainer import RolloutTrainer
from slime.utils.arguments import needs_reference


class MegatronActor(RolloutTrainer):
    def __init__(self, args, rank: int, world_size: int):
        if not dist.is_initialized():
            raise RuntimeError("MegatronActor needs torch.distributed initialised (launch.init_distributed)")
        from megatron.core import parallel_state as ps

        if args.advantage_estimator == "ppo" and args.loss_type != "sft_loss":
            raise ValueError("--advantage-estimator ppo needs a critic, which --train-backend megatron does not "
                             "have yet; use --train-backend fsdp or a critic-free estimator (grpo, reinforce_plus_plus)")
        self.args, self.rank, self.world_size = args, rank, world_size
        self.layout = init_parallel(getattr(args, "tensor_model_parallel_size", 1) or 1, args.seed)
        self.dp_rank, self.dp_size = self.layout.dp_rank, self.layout.dp_size
        self.dp_group = ps.get_data_parallel_group() if self.dp_size < world_size else None
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else \
            torch.device("cpu")
        self.sft = args.loss_type == "sft_loss"
        self.tokenizer = self._load_tokenizer(args.hf_checkpoint)
        self.chunk_size = getattr(args, "log_probs_chunk_size", -1)
        self.recompute = bool(getattr(args, "gradient_checkpointing", False))

        policy = weight_sources.resolve(args.hf_checkpoint, "--hf-checkpoint", {})
        if policy.hf_folder is None:
            raise ValueError("--hf-checkpoint must be a HF folder (config.json + *.safetensors)")
        self.config = policy.config
        self._check_shape_flags()
        self.model, self.shape = self._build(policy, trained=True)
        self.vocab_size = self.shape.vocab_size
        self.pad_token_id = self._pad_id(SimpleNamespace(pad_token_id=self.config.get("pad_token_id")))
        # On GPUs the fused kernel updates in place: no float32 temporaries the size of all moments.
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
                                           eps=args.adam_eps, weight_decay=args.weight_decay,
                                           fused=torch.cuda.is_available())
        self.optimizer_steps = 0
        self.full_opd = not self.sft and args.use_opd and getattr(args, "opd_loss", "sampled") == "full"
        self.ref = self.teacher = self.critic = self.critic_optimizer = None
        if not self.sft and needs_reference(args):
            self.ref = self._load_frozen(args.ref_load or args.hf_checkpoint, "--ref-load",
                                         getattr(args, "ref_ckpt_step", None))
        if not self.sft and args.use_opd and args.opd_type == "megatron":
            self.teacher = self._load_frozen(args.opd_teacher_load, "--opd-teacher-load", args.opd_teacher_ckpt_step)

    # ------------------------------------------------------------------ setup helpers
    def _check_shape_flags(self) -> None:
        """Upstream's model-shape flags (--num-layers, --hidden-size, ...) must describe --hf-checkpoint."""
        problems = shape_mismatches(self.args, self.config)
        if problems:
            raise ValueError("; ".join(problems))

    def _build(self, source: weight_sources.WeightSource, *, trained: bool):
        model = build_gpt(source.config, self.args, self.layout.tp_size)
        shape = model.slime_shape
        hf_weights.load_local(model, hf_weights.shard(source.full_state(shape), shape, self.layout.tp_rank,
                                                      self.layout.tp_size))
        if trained and self.recompute:
            forward.enable_recompute(model)
        if not trained:
            model.eval()
            model.requires_grad_(False)
        return model, shape

    def _load_frozen(self, path: str, flag: str, ckpt_step: int | None):
        source = weight_sources.resolve(path, flag, self.config, ckpt_step)
        if source.hf_folder is not None:
            # A same-size but permuted tokenizer would score other tokens than the policy sampled.
            teacher_vocab.check_local_vocab(self.args.hf_checkpoint, source.hf_folder, flag,
                                            policy_vocab=self.tokenizer.get_vocab() if self.tokenizer else None)
        model, shape = self._build(source, trained=False)
        if shape.vocab_size != self.shape.vocab_size:
            raise ValueError(f"{flag} {path!r} has a vocabulary of {shape.vocab_size}, the policy {self.shape.vocab_size}")
        return model

    # ------------------------------------------------------------------ backend hooks (rollout_trainer)
    def _score(self, model, batch, *, entropy=False, teacher=None):
        return forward.score(model, batch, temperature=self.args.rollout_temperature, device=self.device,
                             chunk_size=self.chunk_size, entropy=entropy, teacher=teacher)

    def _kl_teacher(self, batch):
        if self.teacher is not None:
            return forward.teacher_for_kl(self.teacher, batch, temperature=self.args.rollout_temperature,
                                          device=self.device, chunk_size=self.chunk_size)
        return None, topk_teacher(batch, self.device)

    def _named_grads(self, model) -> dict[str, torch.Tensor]:
        """Gradients by local-spec parameter name; a parameter no micro-batch reached gets zeros, so it
        still takes part in the reductions."""
        out = {}
        for name, p in hf_weights.from_te_names(dict(model.named_parameters())).items():
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                out[name] = p.grad
        return out

    def _reduce_grads(self, model) -> None:
        grads = self._named_grads(model)
        if self.dp_size > 1:
            _all_reduce_flat(list(grads.values()), self.dp_group, average=True)
        if self.layout.tp_size > 1:
            sp = model.config.sequence_parallel
            partial = [g for name, g in grads.items() if hf_weights.grad_is_partial_over_tp(name, sp)]
            if partial:
                _all_reduce_flat(partial, self.tp_group, average=False)

    def _clip_grads(self, model) -> float:
        grads = self._named_grads(model)
        # Tensor-parallel shards are disjoint: each rank counts its own. Replicated parameters hold the same
        # gradient on every rank (after _reduce_grads): only the first rank counts them.
        counted = [g.float() for name, g in grads.items()
                   if hf_weights.is_tensor_parallel(name) or self.layout.tp_rank == 0]
        square = torch.stack([g.pow(2).sum() for g in counted]).sum() if counted else torch.zeros((), device=self.device)
        if self.layout.tp_size > 1:
            dist.all_reduce(square, group=self.tp_group)
        norm = float(square.sqrt())
        max_norm = self.args.clip_grad if self.args.clip_grad and self.args.clip_grad > 0 else float("inf")
        coef = max_norm / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_'s rule, as the FSDP backend uses
        if coef < 1.0:
            for g in grads.values():
                g.mul_(coef)
        return norm

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str) -> None:
        checkpoint.save(self, path)

    def load(self, path: str) -> None:
        checkpoint.load(self, path)

    def export_hf(self, path: str) -> None:
        checkpoint.export_hf(self, os.path.abspath(path))


def _all_reduce_flat(tensors: list[torch.Tensor], group, *, average: bool) -> None:
    """One collective for many tensors: flatten, reduce, copy back."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    if average:
        flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
