"""Every shim checks that its target is still what it was written against, and refuses loudly if it moved."""

from __future__ import annotations

import hashlib
import inspect


class ShimTargetMoved(RuntimeError):
    pass


def source_digest(obj) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def expect_source(obj, digest: str, shim: str) -> None:
    """Refuse to patch ``obj`` unless its source hashes to ``digest`` (the version the shim was written for)."""
    got = source_digest(obj)
    if got != digest:
        name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"
        raise ShimTargetMoved(f"train_cpu shim {shim!r}: {name} changed (source sha256 {got}, written for {digest}); "
                              "re-check the shim against the new code and update its digest")


def expect_signature(obj, params: list[str], shim: str) -> None:
    got = list(inspect.signature(obj).parameters)
    if got != params:
        raise ShimTargetMoved(f"train_cpu shim {shim!r}: {obj.__qualname__}{inspect.signature(obj)} no longer has "
                              f"the parameters {params}; re-check the shim")
