"""Log-probs, entropies and whole-distribution OPD KLs from final hidden states, a chunk of positions at a time.

The plain way (``lm_head(hidden)`` for every position, then a float32 log-softmax) holds
``[positions, vocab]`` float32 rows of a whole micro-batch, several times over for autograd: with
Qwen3's 151,936-token vocabulary that is ~0.6 MB per position per copy, far more than the model's own
activations at long sequence lengths. Here the head runs over ``chunk_size`` positions at a time and
each chunk's rows are dropped as soon as its per-position results are taken; the backward recomputes
each chunk's rows and applies the gradient in closed form (below), so peak memory is a few
``[chunk_size, vocab]`` float32 buffers whatever the sequence length.

Per position, with ``z = (W h + b) / T``, ``logp = log_softmax(z)``, ``p = exp(logp)``:

* log-prob of the target ``a``: ``d/dz = onehot(a) - p``
* entropy ``H = -sum p logp``: ``d/dz = -p (logp + H)``
* reverse KL to a teacher with full rows ``logt``, ``KL = sum p (logp - logt)``:
  ``d/dz = p (logp - logt - KL)`` (the teacher is frozen)
* the top-k form of that KL (``slime.backends.fsdp_utils.opd_kl.topk_reverse_kl``) is a function ``f(logp)``; its
  gradient ``G = df/dlogp`` is taken by autograd on the chunk and mapped through the log-softmax:
  ``d/dz = G - p * sum(G)``.

Forward values use the same formulas as the unchunked path (``forward.py`` with chunking off and
``slime.backends.fsdp_utils.opd_kl``), so the two agree within float rounding.

The rows may also be one tensor-parallel rank's slice of the vocabulary (``Vocab`` with a process group,
the Megatron backend's output layer): every sum, maximum or pick over the vocabulary is then completed
with an all-reduce over the group, the per-position results are the same on every rank, each rank's
weight gradient covers its own rows, and the hidden states' gradient is summed over the group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from slime.backends.fsdp_utils import opd_kl


class Vocab:
    """The vocabulary columns a head's rows hold: all of them (``group`` None), or the ``size`` ids from
    ``start`` of one rank of ``group``, the ranks together covering the vocabulary once."""

    def __init__(self, start: int = 0, size: int | None = None, group=None):
        self.start, self.size, self.group = start, size, group

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the last dimension, across shards."""
        out = x.sum(-1)
        if self.group is not None:
            dist.all_reduce(out, group=self.group)
        return out

    def log_softmax(self, z: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return torch.log_softmax(z, dim=-1)
        top = z.max(-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.group)
        return z - (self.sum((z - top.unsqueeze(-1)).exp()).log() + top).unsqueeze(-1)

    def logsumexp(self, z: torch.Tensor) -> torch.Tensor:
        """log of the summed exponentials along the last dimension, across shards (-inf for none)."""
        if self.group is None:
            return torch.logsumexp(z, dim=-1)
        top = z.max(-1).values if z.shape[-1] else z.new_full(z.shape[:-1], float("-inf"))
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.group)
        safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        return self.sum((z - safe.unsqueeze(-1)).exp()).log() + safe

    def local(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(which of the global ``ids`` this shard holds, their column here; 0 where not held)."""
        if self.group is None:
            return torch.ones_like(ids, dtype=torch.bool), ids
        held = (ids >= self.start) & (ids < self.start + self.size)
        return held, torch.where(held, ids - self.start, torch.zeros_like(ids))

    def pick(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``rows`` at global column ids (``[positions]`` or ``[positions, k]``), across shards."""
        held, col = self.local(ids)
        flat = col if col.dim() == rows.dim() else col.unsqueeze(-1)
        values = rows.gather(-1, flat)
        values = values if col.dim() == rows.dim() else values.squeeze(-1)
        if self.group is None:
            return values
        values = torch.where(held, values, torch.zeros_like(values))
        dist.all_reduce(values, group=self.group)
        return values

    def reduce_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """The hidden states' gradient: each shard contributes its columns' part."""
        if self.group is not None:
            dist.all_reduce(grad, group=self.group)
        return grad


WHOLE = Vocab()


def log_softmax_rows(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     temperature: float, vocab: Vocab = WHOLE) -> torch.Tensor:
    """``log_softmax((W h + b) / T)`` in float32, the head in the hidden states' dtype (as ``lm_head`` runs)."""
    return vocab.log_softmax(F.linear(hidden, weight, bias).float() / temperature)


@dataclass
class FullTeacher:
    """A frozen teacher known by its final hidden states at the same positions and its head weight."""

    hidden: torch.Tensor  # [positions, teacher hidden]
    weight: torch.Tensor  # [vocab, teacher hidden]
    bias: torch.Tensor | None = None

    def rows(self, sl: slice, temperature: float, vocab: Vocab = WHOLE) -> torch.Tensor:
        return log_softmax_rows(self.hidden[sl], self.weight, self.bias, temperature, vocab)


@dataclass
class TopkTeacher:
    """A teacher known only by its top-k log-probs per position (a server answering ``top_logprobs_num``)."""

    ids: torch.Tensor  # [positions, k] long
    log_probs: torch.Tensor  # [positions, k] float32
    valid: torch.Tensor  # [positions] bool; the KL is 0 (and has no gradient) where False

    def kl(self, student_rows: torch.Tensor, sl: slice) -> torch.Tensor:
        """From whole-vocabulary rows (the unchunked path)."""
        kl = opd_kl.topk_reverse_kl(student_rows, self.ids[sl], self.log_probs[sl])
        return torch.where(self.valid[sl].to(kl.device), kl, torch.zeros_like(kl))

    def columns(self, logp: torch.Tensor, sl: slice, vocab: Vocab):
        """(which ids this shard holds, their columns here, a ``[positions, columns]`` mask of the top-k)."""
        held, col = vocab.local(self.ids[sl])
        count = torch.zeros(logp.shape, dtype=torch.int32, device=logp.device)
        return held, col, count.scatter_add_(-1, col, held.int()) > 0

    def parts(self, logp: torch.Tensor, sl: slice, vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor]:
        """The student's log-probs of the k ids and the log of its mass outside them (``s_rest``)."""
        is_top = self.columns(logp, sl, vocab)[2]
        return vocab.pick(logp, self.ids[sl]), vocab.logsumexp(logp.masked_fill(is_top, float("-inf")))

    def kl_from_parts(self, s_top: torch.Tensor, s_rest: torch.Tensor, sl: slice) -> torch.Tensor:
        kl = opd_kl.topk_kl_from_parts(s_top, s_rest, self.log_probs[sl].to(s_top.dtype))
        return torch.where(self.valid[sl].to(kl.device), kl, torch.zeros_like(kl))


@dataclass
class HeadSpec:
    """What to compute at each position. Output columns: log-prob, then entropy, then KL (when asked)."""

    targets: torch.Tensor  # [positions] long: the token whose log-prob is taken
    temperature: float
    chunk_size: int
    entropy: bool = False
    teacher: FullTeacher | TopkTeacher | None = None
    vocab: Vocab = WHOLE

    @property
    def columns(self) -> int:
        return 1 + int(self.entropy) + int(self.teacher is not None)

    def chunks(self, n: int):
        for start in range(0, n, self.chunk_size):
            yield slice(start, min(n, start + self.chunk_size))


def _chunk_stats(logp: torch.Tensor, spec: HeadSpec, sl: slice) -> list[torch.Tensor]:
    vocab = spec.vocab
    cols = [vocab.pick(logp, spec.targets[sl])]
    if spec.entropy:
        cols.append(-vocab.sum(logp.exp() * logp))
    if isinstance(spec.teacher, FullTeacher):
        teacher = spec.teacher.rows(sl, spec.temperature, vocab)
        cols.append(opd_kl.full_reverse_kl(logp, teacher) if vocab.group is None else
                    vocab.sum(logp.exp() * (logp - teacher)))
    elif isinstance(spec.teacher, TopkTeacher):
        cols.append(spec.teacher.kl_from_parts(*spec.teacher.parts(logp, sl, vocab), sl))
    return cols


def _forward(hidden, weight, bias, spec: HeadSpec) -> torch.Tensor:
    out = torch.empty(hidden.shape[0], spec.columns, dtype=torch.float32, device=hidden.device)
    for sl in spec.chunks(hidden.shape[0]):
        logp = log_softmax_rows(hidden[sl], weight, bias, spec.temperature, spec.vocab)
        out[sl] = torch.stack(_chunk_stats(logp, spec, sl), dim=-1)
        del logp
    return out


def _topk_grad(logp: torch.Tensor, g_kl: torch.Tensor, spec: HeadSpec, sl: slice) -> torch.Tensor:
    """``G = d(g_kl * KL_topk) / d logp`` on this chunk's columns, through the KL's two parts: the k picked
    log-probs (their columns get ``dKL/ds_top``) and ``s_rest`` (each outside column j gets
    ``dKL/ds_rest * exp(logp_j - s_rest)``)."""
    teacher, vocab = spec.teacher, spec.vocab
    s_top, s_rest = teacher.parts(logp, sl, vocab)
    with torch.enable_grad():
        top_leaf, rest_leaf = s_top.detach().requires_grad_(True), s_rest.detach().requires_grad_(True)
        g_top, g_rest = torch.autograd.grad(teacher.kl_from_parts(top_leaf, rest_leaf, sl), (top_leaf, rest_leaf), g_kl)
    held, col, is_top = teacher.columns(logp, sl, vocab)
    grad = (logp - s_rest.unsqueeze(-1)).exp_().mul_(g_rest.unsqueeze(-1)).masked_fill_(is_top, 0.0)
    return grad.scatter_add_(-1, col, torch.where(held, g_top, torch.zeros_like(g_top)))


def _logits_grad(logp: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, spec: HeadSpec,
                 sl: slice) -> torch.Tensor:
    """``d loss / d z`` of one chunk (float32), built in place in the buffers of ``logp`` and ``p``."""
    vocab = spec.vocab
    g_lp = grad[:, 0]
    col = 1
    g_ent = h = None
    if spec.entropy:
        g_ent, h = grad[:, col], out[:, col]
        col += 1
    g_kl = kl = None
    if spec.teacher is not None:
        g_kl, kl = grad[:, col], out[:, col]
    topk_g = _topk_grad(logp, g_kl, spec, sl) if isinstance(spec.teacher, TopkTeacher) else None
    p = logp.exp()
    # S (per row) so that dz = -p * S (+ onehot * g_lp + G for the top-k term):
    #   S = g_lp + g_ent (logp + H) - g_kl_full (logp - logt - KL) + sum(G)
    scale = torch.zeros_like(g_lp)
    row = g_lp.clone()
    if g_ent is not None:
        scale += g_ent
        row += g_ent * h
    if isinstance(spec.teacher, FullTeacher):
        scale -= g_kl
        row += g_kl * kl
    if topk_g is not None:
        row += vocab.sum(topk_g)
    s = logp.mul_(scale.unsqueeze(-1))
    if isinstance(spec.teacher, FullTeacher):
        s.addcmul_(spec.teacher.rows(sl, spec.temperature, vocab), g_kl.unsqueeze(-1))
    s.add_(row.unsqueeze(-1))
    dz = p.mul_(s).neg_()
    del s
    if topk_g is not None:
        dz.add_(topk_g)
    held, target = vocab.local(spec.targets[sl])
    dz.scatter_add_(-1, target.unsqueeze(-1), torch.where(held, g_lp, torch.zeros_like(g_lp)).unsqueeze(-1))
    return dz.div_(spec.temperature)


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, spec):
        out = _forward(hidden, weight, bias, spec)
        ctx.save_for_backward(hidden, weight, bias, out)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, out = ctx.saved_tensors
        spec: HeadSpec = ctx.spec
        grad_out = grad_out.float()
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if want_h else None
        # Weight gradients are summed over chunks in float32 (a bf16 sum would round once per chunk).
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        for sl in spec.chunks(hidden.shape[0]):
            logp = log_softmax_rows(hidden[sl], weight, bias, spec.temperature, spec.vocab)
            dz = _logits_grad(logp, grad_out[sl], out[sl], spec, sl).to(weight.dtype)
            del logp
            if want_h:
                grad_h[sl] = dz @ weight
            if want_w:
                if weight.dtype == torch.float32:
                    grad_w.addmm_(dz.t(), hidden[sl])
                else:
                    grad_w += dz.t() @ hidden[sl]
            if want_b:
                grad_b += dz.float().sum(0)
            del dz
        if want_h:
            grad_h = spec.vocab.reduce_grad(grad_h)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None)


def head_stats(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: HeadSpec) -> torch.Tensor:
    """``[positions, spec.columns]`` float32: log-prob of each target, then entropy / KL when asked.

    Differentiable in ``hidden``, ``weight`` and ``bias`` (chunks recomputed in backward). ``hidden`` is
    ``[positions, hidden]``: only the positions whose results are wanted, not whole padded sequences.
    """
    if spec.chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {spec.chunk_size}")
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not needs_grad:
        with torch.no_grad():
            return _forward(hidden, weight, bias, spec)
    return _ChunkedHead.apply(hidden, weight, bias, spec)
