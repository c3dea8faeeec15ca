"""Two-sided significance tests for the benchmark reports, without SciPy.

Welch's t-test (unequal variances) for two groups of per-seed results, and the paired t-test when
both methods ran the same seeds. The t distribution's tail comes from the regularised incomplete
beta function, ``P(|T| > t) = I_{nu / (nu + t^2)}(nu / 2, 1 / 2)``, evaluated with Lentz's
continued fraction.
"""

from __future__ import annotations

import math
import statistics


def _betacf(a: float, b: float, x: float, iterations: int = 300, eps: float = 1e-14) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, iterations + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, dof: float) -> float:
    if math.isnan(t) or dof <= 0:
        return float("nan")
    return regularized_incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """``(t, p)`` of mean(a) - mean(b); p is nan when either group has fewer than 2 values or no spread."""
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return float("nan"), float("nan")
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return t, t_two_sided_p(t, dof)


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """``(t, p)`` of the mean per-pair difference a - b (same seeds, same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired test needs equal lengths, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    if len(diffs) < 2 or statistics.pstdev(diffs) == 0:
        return float("nan"), float("nan")
    t = statistics.fmean(diffs) / (statistics.stdev(diffs) / math.sqrt(len(diffs)))
    return t, t_two_sided_p(t, len(diffs) - 1)


def t_quantile(p_two_sided: float, dof: float) -> float:
    """The ``t`` with ``P(|T| > t) = p_two_sided`` (bisection on :func:`t_two_sided_p`, which falls in ``t``)."""
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, dof) > p_two_sided:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_two_sided_p(mid, dof) > p_two_sided else (lo, mid)
    return (lo + hi) / 2.0


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the t-based confidence interval of the mean (nan bounds below 2 values)."""
    mean = statistics.fmean(values) if values else float("nan")
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = t_quantile(1.0 - level, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half
