"""--kl-ctrl adaptive under data and context parallelism, on CPU with gloo.

Every rank reduces the step's KL with ``reduce_observed_kl`` and updates its own controller. The contract: for
each (dp, cp) layout every rank ends with the same coefficient, equal to the one a single process computes from
all samples. One sample is prompt-heavy, so at cp = 2 one context-parallel rank holds none of its response
tokens and still takes part in the all-reduce.
"""

import argparse
import json
import os
import socket
import time

import pytest
import torch

NUM_GPUS = 0

# (total_length, response_length); sample 2 is prompt-heavy: at cp = 2 its response lies on one rank only.
SEQS = [(20, 12), (30, 25), (64, 4), (16, 10)]
SEED = 7
TARGET, HORIZON, INIT = 0.05, 40.0, 0.1
# A hang fails the test after this many seconds; a slow runner only waits longer. Raise it on a loaded machine.
DEADLINE_S = float(os.environ.get("SLIME_TEST_KL_CTRL_DEADLINE", "900"))


def _mark(out_dir, rank, where):
    """Record where ``rank`` is, so a test that times out can name the rank that never got past a collective."""
    with open(os.path.join(out_dir, f"rank{rank}.where"), "w") as f:
        f.write(where)


def _join(ctx, world_size, out_dir, what):
    deadline = time.time() + DEADLINE_S
    while not ctx.join(timeout=5):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            where = [_where(out_dir, rank) for rank in range(world_size)]
            stuck = ", ".join(f"rank {rank} {w}" for rank, w in enumerate(where) if w != "done")
            pytest.fail(f"{what}: not finished after {DEADLINE_S:.0f} s (SLIME_TEST_KL_CTRL_DEADLINE): {stuck}")


def _where(out_dir, rank):
    path = os.path.join(out_dir, f"rank{rank}.where")
    return open(path).read() if os.path.exists(path) else "not started"


def _samples():
    gen = torch.Generator().manual_seed(SEED)
    kl = [torch.rand(resp, generator=gen) * 0.2 for _, resp in SEQS]
    masks = [(torch.rand(resp, generator=gen) > 0.3).float() for _, resp in SEQS]
    for m in masks:
        m[0] = 1.0
    return kl, masks


def _expected():
    kl, masks = _samples()
    means = [float((k * m).sum() / m.sum()) for k, m in zip(kl, masks, strict=True)]
    observed = sum(means) / len(means)
    value = INIT
    for _ in range(3):
        error = min(max(observed / TARGET - 1, -0.2), 0.2)
        value *= 1 + error * len(SEQS) / HORIZON
    return observed, value


def _worker(rank, world_size, dp_size, cp_size, port, out_dir):
    import _cp_dist_helpers  # noqa: F401  (installs the megatron stub in this process)
    import torch.distributed as dist
    from _cp_dist_helpers import stub_megatron_in_worker

    cp_rank, dp_rank = rank % cp_size, rank // cp_size
    stub_megatron_in_worker(cp_size, cp_rank)
    from megatron.core import mpu

    mpu.is_pipeline_last_stage = lambda: True
    mpu.get_tensor_model_parallel_rank = lambda: 0
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from _cp_dist_helpers import cp_chunk_response_tensor

        from slime.backends.megatron_utils.loss import reduce_observed_kl
        from slime.utils.kl_controller import AdaptiveKLController

        group = dist.new_group(ranks=list(range(world_size)))
        kl, masks = _samples()
        mine = [i for i in range(len(SEQS)) if i % dp_size == dp_rank]
        local_kl = [kl[i] if cp_size == 1 else cp_chunk_response_tensor(kl[i], *SEQS[i]) for i in mine]
        rollout_data = {
            "kl": local_kl,
            "loss_masks": [masks[i] for i in mine],
            "total_lengths": [SEQS[i][0] for i in mine],
            "response_lengths": [SEQS[i][1] for i in mine],
        }
        empty = any(x.numel() == 0 for x in local_kl)
        ctrl = AdaptiveKLController(INIT, TARGET, HORIZON)
        for step in range(3):
            _mark(out_dir, rank, f"inside the KL all-reduce of step {step}")
            observed, count = reduce_observed_kl(rollout_data, group)
            _mark(out_dir, rank, f"past the KL all-reduce of step {step}")
            ctrl.update(observed, count)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"observed": observed, "count": count, "value": ctrl.value, "empty": empty}, f)
        _mark(out_dir, rank, "done")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dp_size,cp_size", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_every_rank_updates_to_the_single_process_value(tmp_path, dp_size, cp_size):
    import torch.multiprocessing as mp

    world_size = dp_size * cp_size
    ctx = mp.spawn(
        _worker, args=(world_size, dp_size, cp_size, _free_port(), str(tmp_path)), nprocs=world_size, join=False
    )
    _join(ctx, world_size, str(tmp_path), f"dp={dp_size} cp={cp_size}")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    observed, value = _expected()
    for r in results:
        assert r["count"] == len(SEQS)
        assert r["observed"] == pytest.approx(observed, rel=1e-6)
        assert r["value"] == pytest.approx(value, rel=1e-9)
    assert len({r["value"] for r in results}) == 1  # bit-identical across ranks
    if cp_size > 1:
        assert any(r["empty"] for r in results), "the layout should leave a CP rank without response tokens"


def _restore_worker(rank, world_size, port, saved_dir, empty_dir, out_dir):
    import torch.distributed as dist

    from slime.utils.kl_controller import AdaptiveKLController, restore_kl_controller, step_kl_controller

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        group = dist.new_group(ranks=list(range(world_size)))
        # Only rank 0 can see the saved state: the others must get it from the broadcast.
        args = argparse.Namespace(load=saved_dir if rank == 0 else empty_dir, finetune=False)
        ctrl = AdaptiveKLController(INIT, TARGET, HORIZON)
        _mark(out_dir, rank, "inside the restore's broadcast")
        state = restore_kl_controller(ctrl, args, 3, group)
        restored = ctrl.value
        _mark(out_dir, rank, "inside the step's check")
        step_kl_controller(ctrl, 2 * TARGET, len(SEQS), check_group=group)  # asserts equal values on all ranks
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"state": state, "restored": restored, "value": ctrl.value}, f)
        _mark(out_dir, rank, "done")
    finally:
        dist.destroy_process_group()


def test_resume_restores_the_rank_0_state_on_every_rank(tmp_path):
    import torch.multiprocessing as mp

    from slime.utils.kl_controller import AdaptiveKLController, save_kl_controller

    saved = AdaptiveKLController(INIT, TARGET, HORIZON)
    saved.update(0.0, len(SEQS))
    save_kl_controller(saved, str(tmp_path / "saved"), 3)
    (tmp_path / "empty").mkdir()
    args = (2, _free_port(), str(tmp_path / "saved"), str(tmp_path / "empty"), str(tmp_path))
    _join(mp.spawn(_restore_worker, args=args, nprocs=2, join=False), 2, str(tmp_path), "the resume")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert r["state"] == saved.state_dict() and r["restored"] == saved.value
    assert results[0]["value"] == results[1]["value"] > saved.value


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
