"""Estimated peak memory per trainer device, printed by ``--dry-run`` (docs/en/fsdp_backend.md, "Memory").

The estimate follows what the FSDP2 trainer (``slime/backends/fsdp_utils``) allocates on every device of
a ``world``-way full shard, phase by phase of a training step (``estimate``), and reports the phase that
peaks, by component:

* **weights**: every loaded model's float32 master copy, sharded (``4 P / world``); plus the gathered
  compute copies the trained policy holds at once: its root (embeddings, LM head; FSDP keeps them from
  forward to backward) and two decoder layers (the one running and the one prefetched);
* **gradients**: float32, sharded, for the trained models; plus the gathered root's and one layer's;
* **optimizer**: AdamW's two float32 moments, sharded, for the trained models (policy, critic);
* **activations**: what autograd keeps per token of the micro-batch, counted tensor by tensor for a
  Llama/Qwen decoder layer as transformers runs it (RMSNorms save a float32 copy), all layers, or with
  ``--gradient-checkpointing`` each layer's input plus one layer being recomputed;
* **log-prob workspace**: the LM head's ``[positions, vocab]`` float32 buffers, per chunk
  (``--log-probs-chunk-size``) or for the whole micro-batch (chunking off), plus an in-trainer teacher's
  head copy for ``--opd-loss full``.

Compute runs in bfloat16 on GPUs (``device="cuda"``), float32 on CPU; the CPU form is what the tests
check against measured peaks of scaled-down models. Dense decoders only (no mixture of experts).

With ``--train-backend megatron`` the estimate is ``estimate_megatron`` (tensor parallelism over
``--tensor-model-parallel-size`` ranks, the rest data-parallel; see its docstring and
docs/en/megatron_backend.md). It has not been compared with measured peaks yet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slime.utils.hf_config import read_config

GIB = 1024 ** 3
# The plan says "fits" only with this share of the device left for the CUDA context, NCCL buffers and
# allocator fragmentation, none of which the estimate counts.
HEADROOM = 0.10
# Without --rollout-max-context-len the prompt length is unknown before the run; the plan assumes this.
ASSUMED_PROMPT_TOKENS = 1024
# Live float32 [positions, vocab] buffers of the chunked head at its peak (backward: the recomputed
# log-probs, the probabilities becoming the logits' gradient, and the transient head output), and of the
# whole-row path per response position (logits, log-softmax, exp, and their gradients).
CHUNK_ROWS = 3
WHOLE_ROWS = 4


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qk_norm: bool  # Qwen3 normalises q and k per head

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape":
        if config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts"):
            raise ValueError("mixture-of-experts configs are not covered by the memory plan")
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size") if k not in config]
        if missing:
            raise ValueError(f"config lacks {missing}: not a decoder config the memory plan knows")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(vocab=int(config["vocab_size"]), hidden=hidden, layers=int(config["num_hidden_layers"]),
                   heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate=int(config["intermediate_size"]), tied=bool(config.get("tie_word_embeddings")),
                   qk_norm=str(config.get("model_type", "")).startswith("qwen3"))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def root_params(self) -> int:
        """Embeddings, LM head (unless tied) and the final norm: FSDP's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def layer_activation_bytes(self, c: int, repeat_kv: bool) -> int:
        """Bytes autograd keeps per token for one decoder layer, compute dtype ``c`` bytes.

        Counted tensor by tensor for transformers' Llama/Qwen layers: RoPE and the per-head q/k norms'
        outputs are not kept (their backward needs only cos/sin and the weight), the projections keep
        their inputs, the attention kernel its q, k, v, output and log-sum-exp.
        """
        return sum(self.layer_activation_split(c, repeat_kv))

    def layer_activation_split(self, c: int, repeat_kv: bool) -> tuple[int, int]:
        """:meth:`layer_activation_bytes` as (hidden-sized part: the two norms, their inputs and outputs;
        inner part: attention and MLP). Megatron's tensor parallelism splits the inner part over its ranks,
        sequence parallelism the hidden-sized one too."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        outer = 2 * (4 + 4 + c) * h  # input and post-attention norms: float32 input, float32 normalised, output
        b = 0
        if self.qk_norm:
            b += (4 + 4) * (q + kv)  # Qwen3's q/k norms: float32 input and normalised
        b += c * (q + kv) + c * kv  # rotated q, k and v, kept by the attention kernel
        if repeat_kv and kv < q:
            b += 2 * c * (q - kv)  # k and v repeated to every query head (padded batches)
        b += 2 * c * q + 4 * self.heads  # attention output, its o_proj-layout copy, log-sum-exp
        return outer, b + 4 * c * i  # MLP: gate, up, act(gate), act(gate) * up

    def backward_transient_bytes(self, c: int) -> int:
        """Per token: the gradient buffers of one layer's backward (MLP and attention), at most at once."""
        return c * (4 * self.intermediate + 2 * self.hidden)


@dataclass
class Workload:
    """What one trainer device runs at its peak."""

    world: int
    tokens: int  # padded tokens of the largest training micro-batch
    samples_per_micro_batch: int  # the most samples one micro-batch may hold (> 1: padding mask)
    chunk: int  # --log-probs-chunk-size (<= 0: whole rows)
    recompute: bool
    accumulates: bool = True  # several micro-batches per optimizer step: gradients live during each
    full_kl_teacher: ModelShape | None = None  # --opd-loss full with an in-trainer teacher
    device: str = "cuda"
    tp: int = 1  # Megatron's tensor-parallel size (--train-backend megatron); world = tp x data-parallel
    sequence_parallel: bool = False


def _head_rows(policy: ModelShape, work: Workload, c: int, teacher_head: int) -> int:
    """The LM head's per-position buffers (chunk by chunk, or whole rows) and, for --opd-loss full, the
    teacher's; ``teacher_head`` bytes per element of the teacher's head-weight copy."""
    t, v, h = work.tokens, policy.vocab, policy.hidden
    if work.chunk > 0:
        rows = min(work.chunk, t)
        out = rows * v * (4 * CHUNK_ROWS + (c if c != 4 else 0)) + 2 * t * h * c  # + response hidden and grad
        teacher = work.full_kl_teacher
        if teacher is not None:  # its rows per chunk, its head copy and hidden states
            out += rows * v * 4 + teacher.vocab * teacher.hidden * teacher_head + t * teacher.hidden * c
        return out
    out = t * v * c + t * v * 4 * WHOLE_ROWS
    return out + (t * v * 4 if work.full_kl_teacher is not None else 0)


def _workspace(policy: ModelShape, work: Workload, c: int) -> int:
    """The LM head's buffers at the start of backward, including its gathered weight's gradient."""
    v, h = policy.vocab, policy.hidden
    head_grad = c * v * h
    if work.chunk > 0 and c != 4:
        head_grad += v * h * (4 + c)  # float32 sum over chunks and one bfloat16 term
    return _head_rows(policy, work, c, teacher_head=c) + head_grad


def estimate(policy: ModelShape, work: Workload, *, frozen: list[ModelShape] = (),
             critic: ModelShape | None = None) -> dict[str, dict[str, int]]:
    """Bytes per device by component, for each phase of a training step that can peak: the LM head's
    backward (all activations and the head's workspace), the first layer's backward (all activations, a
    recomputed layer and its gradient buffers), the end of backward (every gradient, the root's gathered
    ones), the optimizer step (gradients and AdamW's temporaries). The critic (ppo) trains after the
    policy's backward, on a smaller graph (no LM head): its weights and moments count, its activations not.
    """
    c = 2 if work.device == "cuda" else 4
    trained = [policy] + ([critic] if critic is not None else [])
    shard = lambda p: 4 * p // work.world  # noqa: E731  (float32, one shard)
    t = work.tokens
    masters = sum(shard(m.params) for m in trained + list(frozen))
    adam = sum(2 * shard(m.params) for m in trained)
    grads = sum(shard(m.params) for m in trained)
    root = c * policy.root_params  # the policy's gathered embeddings and head, forward to backward
    layer_weights = c * 2 * policy.layer_params  # the gathered layer and the prefetched one
    layer = policy.layer_activation_bytes(c, repeat_kv=work.samples_per_micro_batch > 1)
    stored = t * (policy.layers * c * policy.hidden if work.recompute else policy.layers * layer)
    stored += t * (4 + 4 + c) * policy.hidden  # final norm
    if work.samples_per_micro_batch > 1:
        stored += t * t  # the boolean attention mask of a padded batch (upper bound)
    working = t * ((layer if work.recompute else 0) + policy.backward_transient_bytes(c))
    live_grads = grads if work.accumulates else 0
    # Optimizer step: on GPUs AdamW runs foreach, with a float32 temporary the size of all moments'
    # shards; on CPU one parameter at a time.
    adam_temp = grads if work.device == "cuda" else 2 * shard(max(policy.vocab * policy.hidden, policy.layer_params))
    return {
        "LM-head backward": {"weights": masters + root, "gradients": live_grads, "optimizer": adam,
                             "activations": stored, "log-prob workspace": _workspace(policy, work, c)},
        "layer backward": {"weights": masters + root + layer_weights,
                           "gradients": live_grads + c * policy.vocab * policy.hidden + c * policy.layer_params,
                           "optimizer": adam, "activations": stored + working, "log-prob workspace": 0},
        "end of backward": {"weights": masters + root, "gradients": grads + root, "optimizer": adam,
                            "activations": 0, "log-prob workspace": 0},
        "optimizer step": {"weights": masters, "gradients": grads, "optimizer": adam + adam_temp,
                           "activations": 0, "log-prob workspace": 0},
    }


def estimate_megatron(policy: ModelShape, work: Workload, *, frozen: list[ModelShape] = (),
                      critic: ModelShape | None = None) -> dict[str, dict[str, int]]:
    """Bytes per device for the Megatron trainer (``--train-backend megatron``): TP ``work.tp`` x DP, PP 1.

    Every model's float32 parameters are split over the TP ranks (vocabulary-parallel embeddings and output
    layer, column/row-parallel projections) and replicated over DP, as are the gradients and AdamW's two
    moments (the trainer keeps a full optimizer per DP rank). Activations: the attention and MLP inner
    parts are split over TP; the hidden-sized parts (norms, layer inputs) also, with sequence parallelism,
    by sequence. Batches are right-padded with an explicit causal mask; attention runs through a fused
    kernel on GPUs (no [seq, seq] scores kept). The chunked log-prob head runs on each rank's share of the
    vocabulary (its rows of the output layer), so its buffers and weight gradient are split over TP too.
    """
    c = 2 if work.device == "cuda" else 4
    tp, t, v, h = work.tp, work.tokens, policy.vocab, policy.hidden
    seq = tp if work.sequence_parallel else 1
    split = lambda p: 4 * p // tp  # noqa: E731  (float32, one TP shard)
    trained = [policy] + ([critic] if critic is not None else [])
    masters = sum(split(m.params) for m in trained + list(frozen))
    grads = sum(split(m.params) for m in trained)
    adam = 2 * grads
    outer, inner = policy.layer_activation_split(c, repeat_kv=False)
    layer = outer // seq + inner // tp
    stored = t * policy.layers * (c * h // seq if work.recompute else layer)
    stored += t * (4 + 4 + c) * h // seq + t * t  # final norm; the causal mask (upper bound)
    working = t * ((layer if work.recompute else 0) + c * (4 * policy.intermediate // tp + 2 * h // seq))
    # The head runs on this rank's vocabulary rows: per-chunk buffers of vocab / TP columns, the float32 sum
    # of its weight-row gradient, and on GPUs a bfloat16 cast of those rows.
    shard_vocab = lambda m: replace(m, vocab=-(-m.vocab // tp))  # noqa: E731
    local = replace(work, full_kl_teacher=shard_vocab(work.full_kl_teacher)) if work.full_kl_teacher else work
    head = 4 * v * h // tp + (c * v * h // tp if c != 4 else 0)
    workspace = _head_rows(shard_vocab(policy), local, c, teacher_head=0) + head
    # Optimizer step: on GPUs the trainer's AdamW is fused (in place); on CPU one parameter at a time.
    adam_temp = 0 if work.device == "cuda" else 2 * split(max(v * h, policy.layer_params))
    return {
        "LM-head backward": {"weights": masters, "gradients": grads if work.accumulates else 0, "optimizer": adam,
                             "activations": stored, "log-prob workspace": workspace},
        "layer backward": {"weights": masters, "gradients": grads, "optimizer": adam,
                           "activations": stored + working, "log-prob workspace": 0},
        "optimizer step": {"weights": masters, "gradients": grads, "optimizer": adam + adam_temp,
                           "activations": 0, "log-prob workspace": 0},
    }


def peak_phase(phases: dict[str, dict[str, int]]) -> str:
    return max(phases, key=lambda name: sum(phases[name].values()))


# ---------------------------------------------------------------------------- from the flags
def _tokens(args) -> tuple[int, int, str]:
    """(padded tokens per micro-batch, samples per micro-batch, how they were derived)."""
    if args.rollout_max_context_len:
        longest, how = args.rollout_max_context_len, f"--rollout-max-context-len {args.rollout_max_context_len}"
    else:
        longest = args.rollout_max_response_len + ASSUMED_PROMPT_TOKENS
        how = f"--rollout-max-response-len {args.rollout_max_response_len} + {ASSUMED_PROMPT_TOKENS} prompt (assumed)"
    if getattr(args, "use_dynamic_batch_size", False):
        budget = args.max_tokens_per_gpu
        # A sample longer than the budget still gets a micro-batch of its own.
        return max(budget, longest), max(1, budget // 2), f"max(--max-tokens-per-gpu {budget}, longest sample: {how})"
    mbs = args.micro_batch_size
    return mbs * longest, mbs, f"--micro-batch-size {mbs} x ({how})"


def _shape(path, flag, fallback: ModelShape | None) -> tuple[ModelShape | None, str]:
    config = read_config(path)
    if config is None:
        return fallback, f"{flag}: no config.json here, assumed the policy's shape"
    return ModelShape.from_config(config), ""


@dataclass
class MemoryPlan:
    phases: dict[str, dict[str, int]]  # bytes per device by component, per phase
    phase: str  # the peak one
    work: Workload
    policy: ModelShape
    models: list[str]
    how: str  # where the micro-batch's token count came from
    notes: list[str]

    @property
    def parts(self) -> dict[str, int]:
        return self.phases[self.phase]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def plan_memory(args, config: dict, *, device: str = "cuda", tokens: int | None = None) -> MemoryPlan:
    """The estimate for a run's flags and its policy's HF config (``tokens`` overrides the micro-batch size)."""
    from slime.utils.arguments import needs_reference

    policy = ModelShape.from_config(config)
    sft = args.loss_type == "sft_loss"
    models, frozen, notes = ["policy + AdamW"], [], []
    if not sft and needs_reference(args):
        ref_path = None if args.ref_load == args.hf_checkpoint else args.ref_load
        ref, note = _shape(ref_path, "--ref-load", policy) if ref_path else (policy, "")
        frozen.append(ref)
        models.append("reference")
        notes.append(note)
    teacher = None
    if not sft and args.use_opd and args.opd_type == "megatron":
        teacher, note = _shape(args.opd_teacher_load, "--opd-teacher-load", policy)
        frozen.append(teacher)
        models.append("in-trainer teacher")
        notes.append(note)
    critic = None
    if not sft and args.advantage_estimator == "ppo":
        critic = ModelShape(**{**policy.__dict__, "tied": True})  # the backbone: embeddings, no LM head
        models.append("critic + AdamW")
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    megatron = args.train_backend == "megatron"
    tp = args.tensor_model_parallel_size if megatron else 1
    mb_tokens, per_mb, how = _tokens(args)
    if tokens is not None:
        mb_tokens, how = tokens, "given"
    per_rank = -(-args.global_batch_size // (world // tp))  # samples per data-parallel rank and step
    work = Workload(world=world, tokens=mb_tokens, samples_per_micro_batch=per_mb, chunk=args.log_probs_chunk_size,
                    recompute=bool(args.gradient_checkpointing),
                    # Packed by tokens, long samples fill a micro-batch alone: assume several per step.
                    accumulates=per_rank > (1 if args.use_dynamic_batch_size else per_mb),
                    full_kl_teacher=teacher if getattr(args, "opd_loss", "sampled") == "full" else None,
                    device=device, tp=tp, sequence_parallel=megatron and args.sequence_parallel)
    phases = (estimate_megatron if megatron else estimate)(policy, work, frozen=frozen, critic=critic)
    return MemoryPlan(phases, peak_phase(phases), work, policy, models, how, [n for n in notes if n])


def describe_memory(args) -> list[str]:
    """The plan's memory section: one line per component and a verdict against --gpu-memory-gb."""
    source = getattr(args, "model_config_json", None) or args.hf_checkpoint
    config = read_config(source)
    if config is None:
        return [f"memory    : skipped: no config.json at --hf-checkpoint {args.hf_checkpoint!r}; pass "
                "--model-config-json PATH (the policy's HF config.json) for an estimate"]
    try:
        plan = plan_memory(args, config)
    except ValueError as err:
        return [f"memory    : skipped: {err}"]
    work = plan.work
    layout = (f"Megatron TP {work.tp} x DP {work.world // work.tp}, float32 weights" if args.train_backend == "megatron"
              else f"FSDP full shard over {work.world}")
    lines = [f"memory    : per trainer device (estimate; {layout}, bf16 compute): "
             f"{', '.join(plan.models)}; policy {plan.policy.params / 1e9:.2f}B parameters",
             f"            micro-batch {work.tokens:,} tokens [{plan.how}], recompute "
             f"{'on' if work.recompute else 'off'}, "
             + (f"log-prob chunks of {work.chunk}" if work.chunk > 0 else "log-probs over whole rows"),
             f"            at its peak ({plan.phase}):"]
    lines += [f"            {name:<19}{value / GIB:8.1f} GiB" for name, value in plan.parts.items()]
    fits = plan.total <= (1 - HEADROOM) * args.gpu_memory_gb * 1e9
    lines.append(f"            {'total':<19}{plan.total / GIB:8.1f} GiB = {plan.total / 1e9:.1f} GB: "
                 f"{'fits' if fits else 'does NOT fit'} in --gpu-memory-gb {args.gpu_memory_gb:g} "
                 f"(keeping {HEADROOM:.0%} for CUDA context, NCCL and fragmentation)")
    others = ", ".join(f"{name} {sum(parts.values()) / GIB:.1f}" for name, parts in plan.phases.items()
                       if name != plan.phase)
    lines.append(f"            other phases (GiB): {others}")
    if not fits:
        more = ("a larger --tensor-model-parallel-size (data parallelism replicates the optimizer)"
                if args.train_backend == "megatron" else "more trainer devices")
        lines.append("            to fit: --recompute-granularity full, --use-dynamic-batch-size "
                     f"--max-tokens-per-gpu N, a smaller --log-probs-chunk-size, or {more}")
    lines += [f"            note: {n}" for n in plan.notes]
    return lines
