"""With nothing new asked, the adaptive-KL PR must leave slime's advantages bit-identical.

    PYTHONPATH=TREE python tools/slime_pr/kl_bit_identity.py dump TREE OUT.pt
    python tools/slime_pr/kl_bit_identity.py compare A.pt B.pt

``dump`` imports TREE's ``compute_advantages_and_returns`` (megatron stubbed, its ``mpu`` one rank: trees.py) and
runs it on fixed inputs for ppo, grpo, reinforce_plus_plus and reinforce_plus_plus_baseline, each with kl_coef 0
and 0.05 (and whitening for the reinforce++ pair, which requires it), called the way the actor
calls it without --kl-ctrl. ``compare`` requires every tensor to be equal bit for bit.
"""

import sys
from argparse import Namespace
from pathlib import Path

import trees  # this folder is the script's: tools/slime_pr/trees.py
import torch


def _rollout(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = [7, 3, 11, 5]
    return {
        "log_probs": [-torch.rand(n, generator=gen) for n in lengths],
        "ref_log_probs": [-torch.rand(n, generator=gen) for n in lengths],
        "rewards": [1.0, -0.25, 0.5, 0.0],
        "values": [torch.randn(n, generator=gen) for n in lengths],
        "response_lengths": lengths,
        "total_lengths": [n + 4 for n in lengths],
        "loss_masks": [(torch.rand(n, generator=gen) > 0.2).float().index_fill_(0, torch.tensor([0]), 1.0) for n in lengths],
    }


def dump(tree: Path, out: Path) -> None:
    trees.install_one_rank_mpu()
    import torch.distributed as dist

    dist.all_reduce = lambda tensor, *a, **kw: None  # one rank: whitening's reduction is the identity
    from slime.backends.megatron_utils import loss

    assert Path(loss.__file__).resolve().is_relative_to(tree.resolve()), f"imported {loss.__file__}, not {tree}'s"
    results = {}
    for estimator in ("ppo", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        for kl_coef in (0.0, 0.05):
            normalize = estimator.startswith("reinforce")
            args = Namespace(
                advantage_estimator=estimator, kl_coef=kl_coef, kl_loss_type="k3", use_rollout_logprobs=False,
                custom_advantage_function_path=None, normalize_advantages=normalize, use_opd=False,
                gamma=0.99, lambd=0.95,
            )
            data = _rollout(11)
            loss.compute_advantages_and_returns(args, data)
            for key in ("advantages", "returns", "kl"):
                results[f"{estimator}/{kl_coef}/{key}"] = [t.clone() for t in data[key]]
    torch.save(results, out)
    print(f"kl_bit_identity: {len(results)} tensor lists from {tree}")


def compare(a: Path, b: Path) -> int:
    ra, rb = torch.load(a), torch.load(b)
    bad = sorted(k for k in ra.keys() | rb.keys() if k not in ra or k not in rb or len(ra[k]) != len(rb[k])
                 or not all(torch.equal(x, y) for x, y in zip(ra[k], rb[k])))
    print(f"kl_bit_identity: {len(ra)} tensor lists compared, {len(bad)} differ" + (f": {bad}" if bad else ""))
    return 1 if bad or not ra else 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
