"""Shared fixtures for the FSDP trainer tests: tiny checkpoints, args, synthetic samples, spawned workers.

Worker functions live here (a module, not a test file) so spawned processes can import them by name.
"""

from __future__ import annotations

import contextlib
import random

import torch

from slime.utils.arguments import get_parser, validate_args
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint
from slime.utils.types import Sample

N_PROMPTS, GROUP = 4, 2


def make_checkpoint(path, seed=0):
    return str(save_tiny_checkpoint(path, hidden_size=32, num_layers=2, num_heads=2, seed=seed))


def student_and_teacher(tmp_path_factory, name: str) -> dict:
    """A one-process group and two different tiny checkpoints under a fresh folder ``name``."""
    from slime.backends.fsdp_utils.launch import ensure_single_process_group

    ensure_single_process_group()
    root = tmp_path_factory.mktemp(name)
    return {"student": make_checkpoint(root / "student", seed=0), "teacher": make_checkpoint(root / "teacher", seed=1),
            "root": root}


def make_args(ckpt, *extra, **overrides):
    argv = ["--hf-checkpoint", ckpt, "--rollout-batch-size", str(N_PROMPTS), "--n-samples-per-prompt", str(GROUP),
            "--micro-batch-size", "2", "--lr", "1e-3", "--rollout-temperature", "0.8", *extra]
    args = get_parser().parse_args(argv)
    for key, value in overrides.items():
        setattr(args, key, value)
    return validate_args(args)


def make_samples(seed=0, n=N_PROMPTS * GROUP, with_teacher=False, with_rollout_lp=False) -> list[Sample]:
    """Samples with varied prompt/response lengths, a masked observation span and group rewards."""
    tok = build_tokenizer()
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        prompt = tok.encode("Q" + "ab"[i % 2] * rng.randint(1, 4) + ":")
        sample = Sample(group_index=i // GROUP, index=i, prompt="", tokens=list(prompt), reward=float(rng.random()))
        lengths = (rng.randint(2, 5), rng.randint(1, 3), rng.randint(1, 4))
        for part, n_tok in enumerate(lengths):
            ids = [rng.randrange(3, len(tok)) for _ in range(n_tok)]
            trainable = part != 1  # the middle span plays an environment observation
            sample.append_response_tokens(tokens=ids, trainable=trainable,
                                          log_probs=[-1.0 - 0.1 * j for j in range(n_tok)] if trainable else None)
        if with_teacher:
            sample.teacher_log_probs = [-0.5 - 0.05 * j for j in range(sample.response_length)]
        if not with_rollout_lp:
            sample.rollout_log_probs = None
        samples.append(sample)
    return samples


def weights(actor) -> dict[str, torch.Tensor]:
    from slime.backends.fsdp_utils.model_io import full_model_state

    return {k: v.clone() for k, v in full_model_state(actor.model).items()}


def scalar_metrics(metrics: dict) -> dict:
    """Deterministic scalar metrics (wall-clock timings differ from run to run by nature)."""
    return {k: v for k, v in metrics.items() if isinstance(v, float) and not k.startswith("time/")}


# ---------------------------------------------------------------------------- runs shared by 1 and N processes
def run_config(rank, world_size, config: dict):
    """Train one configuration; rank 0 returns its metrics and final weights (the others None).

    ``config``: ``argv`` (extra flags), ``ckpt``, ``n_samples``, ``n_rollouts``, optional ``save_after``
    (rollout index) and ``save_to`` (folder).
    """
    from slime.backends.fsdp_utils.actor import FSDPActor

    args = make_args(config["ckpt"], *config["argv"])
    actor = FSDPActor(args, rank, world_size)
    history = []
    for r in range(config["n_rollouts"]):
        history.append(actor.train(r, make_samples(seed=r, n=config["n_samples"], with_teacher=True),
                                   kl_coef=args.kl_coef))
        if config.get("save_after") == r:
            actor.save(config["save_to"])
    final = weights(actor)
    if rank != 0:
        return None
    return {"metrics": [scalar_metrics(m) for m in history], "weights": final,
            "opd": [m.get("per_sample_opd_kl") for m in history]}


def assert_same_run(a, b):
    """Two ``run_config`` results agree: every scalar metric and the final weights, within float rounding."""
    import pytest

    for ma, mb in zip(a["metrics"], b["metrics"]):
        assert ma.keys() == mb.keys()
        for key in ma:
            assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-6), key
    for key in a["weights"]:
        torch.testing.assert_close(a["weights"][key], b["weights"][key], atol=5e-5, rtol=1e-4)


def worker_run_configs(rank, world_size, configs):
    """Entry point for ``launch.run_local_group``: all configurations in one spawn (startup is the cost)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    return [run_config(rank, world_size, c) for c in configs]


@contextlib.contextmanager
def single_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine the thread pool's waits
    dominate; restore the caller's setting afterwards so other tests are unaffected."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------- vocabulary-parallel head
def sharded_head_worker(rank, world_size, inputs, teacher_kind, chunk):
    """The chunked head on this rank's rows of the vocabulary (``Vocab`` over the world group); returns the
    per-position outputs, the hidden states' gradient and this rank's weight-row gradient."""
    import torch.distributed as dist

    from slime.backends.fsdp_utils.chunked_head import FullTeacher, HeadSpec, Vocab, head_stats

    hidden, weight, targets, teacher, topk, loss_weights, temperature = inputs
    rows = -(-weight.shape[0] // world_size)
    start = rank * rows
    held = min(rows, weight.shape[0] - start)
    vocab = Vocab(start, held, dist.group.WORLD)
    hidden = hidden.clone().requires_grad_(True)
    local = weight[start:start + held].clone().requires_grad_(True)
    if teacher_kind == "full":
        teacher = FullTeacher(teacher.hidden, teacher.weight[start:start + held], None)
    spec = HeadSpec(targets, temperature, chunk, True, teacher if teacher_kind == "full" else
                    topk if teacher_kind == "topk" else None, vocab)
    out = head_stats(hidden, local, None, spec)
    (out * loss_weights[:, :out.shape[1]]).sum().backward()
    return out.detach(), hidden.grad, local.grad
