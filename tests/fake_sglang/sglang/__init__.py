"""A stand-in for the ``sglang`` package in tests: only ``python -m sglang.launch_server`` (see there)."""
