"""benchmarks/stats.py: t-test p-values against textbook table values."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import stats  # noqa: E402


@pytest.mark.parametrize("t, dof, p", [(2.262157, 9, 0.05), (2.0, 4, 0.1161165), (1.0, 1, 0.5), (3.182446, 3, 0.05),
                                       (0.0, 7, 1.0), (12.7062, 1, 0.05)])
def test_two_sided_p_matches_t_tables(t, dof, p):
    assert stats.t_two_sided_p(t, dof) == pytest.approx(p, abs=1e-5)
    assert stats.t_two_sided_p(-t, dof) == pytest.approx(p, abs=1e-5)


def test_welch_and_paired():
    a, b = [0.62, 0.58, 0.66, 0.61, 0.64], [0.50, 0.47, 0.55, 0.52, 0.49]
    t, p = stats.welch(a, b)
    assert t > 0 and p < 0.001
    t_rev, p_rev = stats.welch(b, a)
    assert t_rev == pytest.approx(-t) and p_rev == pytest.approx(p)
    t, p = stats.paired(a, [x - 0.01 for x in a])
    assert math.isnan(p)  # identical differences: no spread, no test
    _, p = stats.paired(a, b)
    assert p < 0.01
    assert math.isnan(stats.welch([1.0], [2.0, 3.0])[1])
