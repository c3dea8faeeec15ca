"""Where train.py's Ray start-up goes: ``ray.init`` and the first trainer-like actor, per setting we choose.

    python -m benchmarks.ray_start [--repeats 3] [--variants today,no_runtime_env,...] [--png FILE]

Each variant runs in a fresh Python process (a new local cluster, as each train.py run starts one) and
reports import, ``ray.init``, the first actor's first reply (the trainer's place in a run: a worker process
started, the actor built), and ``ray.shutdown``. The variants change one thing we pass at a time:

* ``today``: train.py before this benchmark: ``num_cpus=2``, ``include_dashboard=False``, ``log_to_driver``, the
  actor with ``runtime_env={"env_vars": {"PYTHONPATH": ...}}`` (as ``TrainerGroup`` did);
* ``no_runtime_env``: the actor without a runtime_env; PYTHONPATH reaches the workers from the driver's
  environment instead (a runtime_env makes the raylet start a dedicated worker through its agent);
* ``no_prestart``: also ``RAY_enable_worker_prestart=0`` (no idle workers started at ``ray.init`` that a
  runtime_env-free actor would not use on 2 cores anyway);
* ``no_log_to_driver``: ``no_runtime_env`` with ``log_to_driver=False``;
* ``small_object_store``: ``no_runtime_env`` with a 256 MiB object store (Ray sizes it at 30% of memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "today": {"runtime_env": True, "env": {}, "init": {}},
    "no_runtime_env": {"runtime_env": False, "env": {}, "init": {}},
    "no_prestart": {"runtime_env": False, "env": {"RAY_enable_worker_prestart": "0"}, "init": {}},
    "no_log_to_driver": {"runtime_env": False, "env": {}, "init": {"log_to_driver": False}},
    "small_object_store": {"runtime_env": False, "env": {}, "init": {"object_store_memory": 256 * 2**20}},
}

CHILD = r'''
import json, logging, os, sys, time
t0 = time.perf_counter()
import ray
t_import = time.perf_counter() - t0
spec = json.loads(sys.argv[1])
init = dict(num_cpus=2, include_dashboard=False, log_to_driver=True, logging_level=logging.WARNING,
            ignore_reinit_error=True)
init.update(spec["init"])
t0 = time.perf_counter()
ray.init(**init)
t_init = time.perf_counter() - t0

class Worker:
    def ping(self):
        return os.getpid()

options = {"num_cpus": 1}
if spec["runtime_env"]:
    options["runtime_env"] = {"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}
t0 = time.perf_counter()
actor = ray.remote(Worker).options(**options).remote()
ray.get(actor.ping.remote())
t_actor = time.perf_counter() - t0
t0 = time.perf_counter()
ray.shutdown()
t_shutdown = time.perf_counter() - t0
print(json.dumps({"import": t_import, "init": t_init, "first_actor": t_actor, "shutdown": t_shutdown}))
'''


def run_variant(name: str) -> dict:
    spec = VARIANTS[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "token", **spec["env"]}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                         timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{name}: exit {out.returncode}\n{out.stderr[-2000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["process"] = wall
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--png", help="also draw the medians as stacked bars into this file")
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    results = {name: [] for name in names}
    for rep in range(args.repeats):  # interleaved: a load change on the shared machine hits every variant
        for name in names:
            results[name].append(run_variant(name))
            print(f"# {rep + 1}/{args.repeats} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    keys = ("import", "init", "first_actor", "shutdown", "process")
    print("| variant | " + " | ".join(f"{k} (s)" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name in names:
        cells = [f"{statistics.median(r[k] for r in results[name]):.1f}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.png:
        draw(results, names, args.png)
    return 0


def draw(results: dict, names: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    left = [0.0] * len(names)
    for key in ("import", "init", "first_actor", "shutdown"):
        widths = [statistics.median(r[key] for r in results[name]) for name in names]
        ax.barh(names, widths, left=left, label=key)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median)")
    ax.set_title("Ray start-up per setting (benchmarks/ray_start.py)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
