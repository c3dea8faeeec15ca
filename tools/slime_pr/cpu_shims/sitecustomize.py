"""Loaded by every Python process train_cpu.py starts (driver, Ray workers) because this folder is on PYTHONPATH.

Does nothing unless SLIME_TRAIN_CPU_SHIMS=1; then it arms post-import hooks (slime_cpu_shims.hooks): each shim is
applied when its target module is first imported, so processes that never import torch (Ray's own) pay nothing.
"""

import os

if os.environ.get("SLIME_TRAIN_CPU_SHIMS") == "1":
    import slime_cpu_shims

    slime_cpu_shims.install()
