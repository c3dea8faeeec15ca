"""train.py's driver process: a local Ray cluster told it has N GPUs (slime's placement group asks for GPU bundles;
no GPU is used, the CPU accelerator runs every rank), then SLIME_DIR/train.py run as __main__, unmodified.

    python -m slime_cpu_shims.driver NUM_GPUS SLIME_DIR/train.py ARGS...
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    num_gpus, train_py, *args = sys.argv[1:]
    # `python train.py` puts train.py's folder first on sys.path, and Ray hands the driver's sys.path[0] to every
    # worker; runpy.run_path does not, so it is put there before Ray starts.
    sys.path.insert(0, os.path.dirname(os.path.abspath(train_py)))
    import ray

    for attempt in range(3):
        try:
            ray.init(num_gpus=int(num_gpus), num_cpus=int(os.environ.get("TRAIN_CPU_RAY_CPUS", "16")),
                     include_dashboard=False, object_store_memory=512 * 1024**2, log_to_driver=True)
            break
        except Exception as exc:  # Ray waits a fixed 30 s for its raylet; a loaded 2-core machine can miss that
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            print(f"train_cpu driver: Ray's node start timed out ({exc}); trying again", flush=True)
            ray.shutdown()
    sys.argv = [train_py, *args]
    try:
        runpy.run_path(train_py, run_name="__main__")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
