"""The OPD objective of the slime PR: this runtime's advantages against upstream slime's own code.

The upstream comparison (``tools/slime_pr/verify_objective.py``) needs an upstream tree and runs only when
``SLIME_UPSTREAM_DIR`` points at one; the runtime half and the comparison itself are checked always.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.slime_pr import objective_cases as oc
from tools.slime_pr import verify_objective as vo

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runtime_results():
    cases = oc.build_spec()
    with oc.TeacherServer() as teacher:
        out = vo.runtime_side({"cases": cases, "teacher_url": teacher.url})
    return cases, out


def test_runtime_hook_is_pure_opd(runtime_results):
    cases, out = runtime_results
    for case in cases:
        rewards = out["cases"][case["name"]]["pure"]["rewards"]
        assert sorted(rewards) == sorted(str(s["index"]) for s in case["samples"])
        assert set(rewards.values()) == {0.0}, case["name"]


def test_runtime_advantages_are_the_opd_term(runtime_results):
    """Pure OPD: A_t = -opd_kl_coef * (student_t - teacher_t) on every response token, whatever the task reward."""
    cases, out = runtime_results
    for case in cases:
        result = out["cases"][case["name"]]["pure"]
        for s in case["samples"]:
            start = len(s["tokens"]) - s["response_length"]
            teacher = [oc.teacher_log_prob(t, start + j) for j, t in enumerate(s["tokens"][start:])]
            student = s["rollout_log_probs"] if case["use_rollout_logprobs"] else s["recomputed_log_probs"]
            kl = [st - te for st, te in zip(student, teacher, strict=True)]
            adv = result["adv"][str(s["index"])]
            assert adv == pytest.approx([-case["opd_kl_coef"] * k for k in kl], abs=1e-5), (case["name"], s["index"])
            assert result["opd_kl"][str(s["index"])] == pytest.approx(kl, abs=1e-5)


def test_comparison_passes_on_equal_results_and_flags_a_small_mismatch(runtime_results, capsys):
    cases, out = runtime_results
    spec = {"cases": cases}
    # Stand-in for upstream: this runtime's numbers; upstream's environment-return hook adds the raw return.
    upstream = copy.deepcopy(out)
    for case in cases:
        task = upstream["cases"][case["name"]]["task"]["adv"]
        for s in case["samples"]:
            pure = out["cases"][case["name"]]["pure"]["adv"][str(s["index"])]
            task[str(s["index"])] = [a + s["task_reward"] for a in pure]
    report = oc.Report()
    oc.compare(spec, upstream, out, report)
    assert report.failed == 0, capsys.readouterr().out

    name, index = cases[1]["name"], str(cases[1]["samples"][0]["index"])
    upstream["cases"][name]["pure"]["adv"][index][0] += 3 * oc.TOL
    report = oc.Report()
    oc.compare(spec, upstream, out, report)
    printed = capsys.readouterr().out
    # The perturbed advantage breaks both equalities: upstream's against this runtime's, and the closed form.
    assert report.failed == 2
    assert f"FAIL  [{name}] advantages" in printed and f"FAIL  [{name}] --opd-type sglang" in printed


@pytest.mark.skipif(
    not os.environ.get("SLIME_UPSTREAM_DIR"), reason="set SLIME_UPSTREAM_DIR to an upstream slime tree"
)
def test_upstream_and_runtime_advantages_match():
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools/slime_pr/verify_objective.py"), os.environ["SLIME_UPSTREAM_DIR"]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    controls = [line for line in proc.stdout.splitlines() if "negative control" in line]
    # One per case, and one more for --opd-type megatron where a prompt has a group (n_samples_per_prompt > 1).
    expected = len(oc.CASES) + sum(1 for _, n, *_ in oc.CASES if n > 1)
    assert len(controls) == expected and all(line.startswith("PASS") for line in controls), proc.stdout
