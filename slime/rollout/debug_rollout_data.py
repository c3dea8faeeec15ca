"""``--save-debug-rollout-data PATH``: each training rollout's samples, as upstream slime writes them.

Upstream's layout: ``torch.save({"rollout_id": id, "samples": [sample.to_dict(), ...]}, path)`` with
``{rollout_id}`` in the path template. The dictionaries hold plain Python values only, so they load
with ``torch.load(weights_only=True)`` (:func:`load`) and can be studied offline, e.g. by
``benchmarks/opd_gradient_noise.py``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slime.utils.types import Sample


def save(path_template: str | None, samples: list[Sample], rollout_id: int) -> None:
    if not path_template:
        return
    path = Path(path_template.format(rollout_id=rollout_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": [s.to_dict() for s in samples]}, path)


def load(path: str) -> list[Sample]:
    data = torch.load(path, weights_only=True)
    return [Sample.from_dict(s) for s in data["samples"]]
