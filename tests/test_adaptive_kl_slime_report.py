"""benchmarks/adaptive_kl_slime_report.py on fabricated runs: the gate's criteria, the controller's pass line, and a
verdict that says so when an adaptive run's coefficient never moved."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import adaptive_kl_slime_report as report  # noqa: E402

STEPS = 10


def _row(ctrl, beta, kls, *, phase="gate", seed=1, betas=None, target=None, ref_beta=None, mode_share=0.02):
    betas = betas or [beta] * len(kls)
    row = {"phase": phase, "ctrl": ctrl, "beta": beta, "seed": seed, "steps": len(kls), "lr": 0.01, "rc": 0,
           "steps_done": len(kls), "key": f"{ctrl}-{beta}-{seed}-{phase}",
           "per_step": [{"step": i, "kl": k, "beta_fit": b, "reward": 0.5, "vowels": 3.0, "mode_share": mode_share}
                        for i, (k, b) in enumerate(zip(kls, betas))]}
    if ctrl == "adaptive":
        # 1x a step's samples: 8 steps let a 2x start settle twice over, so STEPS is long enough to judge
        row.update(target=target, horizon=64.0, ref_beta=ref_beta)
    return row


CLOSED = {"rows": {"0.1": {"kl": 0.4, "reward": 0.8}, "0.2": {"kl": 0.1, "reward": 0.5},
                   "0.3": {"kl": 0.04, "reward": 0.4}}}


def _gate_rows():
    return [_row("fixed", 0.1, [0.3] * STEPS), _row("fixed", 0.2, [0.11] * STEPS), _row("fixed", 0.3, [0.05] * STEPS)]


def test_gate_passes_falling_plateaus_near_the_closed_form():
    g = report.gate(_gate_rows(), CLOSED)
    assert g["passed"] and g["falls"] and not g["degenerate"] and not g["outside_2x"]
    assert [t["ratio"][0] for t in g["table"]] == pytest.approx([0.75, 1.1, 1.25])


def test_gate_fails_on_a_collapse_a_rising_plateau_or_a_plateau_off_by_more_than_2x():
    collapsed = _gate_rows()
    collapsed[0] = _row("fixed", 0.1, [0.3] * STEPS, mode_share=0.6)
    assert report.gate(collapsed, CLOSED)["degenerate"] == [(0.1, 1, STEPS // 2)]
    rising = _gate_rows()
    rising[2] = _row("fixed", 0.3, [0.2] * STEPS)
    assert not report.gate(rising, CLOSED)["falls"]
    far = _gate_rows()
    far[1] = _row("fixed", 0.2, [0.03] * STEPS)  # 0.3x the closed form
    g = report.gate(far, CLOSED)
    assert not g["passed"] and g["outside_2x"] == [(0.2, 1, pytest.approx(0.3))]


def _controller_rows(adaptive_kl, factors):
    """The fixed reference 0.2 and adaptive runs from 0.1 and 0.4 whose coefficients are start * factors."""
    fixed = _row("fixed", 0.2, [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.16, 0.04])  # second half: in band 3/5, dev 0.24
    low = _row("adaptive", 0.1, adaptive_kl, phase="controller", betas=[0.1 * f for f in factors], target=0.1,
               ref_beta=0.2)
    high = _row("adaptive", 0.4, adaptive_kl, phase="controller", betas=[0.4 * f for f in factors], target=0.1,
                ref_beta=0.2)
    return [fixed, low, high]


def test_controller_scores_against_the_fixed_reference_plus_the_margin():
    moving = [1 + 0.01 * i for i in range(STEPS)]
    c = report.controller(_controller_rows([0.1] * STEPS, moving))
    assert c["passed"] and not c["stuck"]
    rows = c["targets"][0]["rows"]
    fixed = next(r for r in rows if r["ctrl"] == "fixed")
    assert (fixed["in_band"], fixed["dev"]) == pytest.approx((0.6, 0.24))
    # Worse than fixed + 0.1 on the mean deviation: not passed, and named.
    c = report.controller(_controller_rows([0.1] * 5 + [0.2] * 5, moving))
    assert c["passed"] is False and len(c["failed"]) == 2


def test_a_coefficient_that_never_moved_is_reported_and_not_credited(tmp_path):
    rows = _controller_rows([0.1] * STEPS, [1.0] * STEPS)  # rewards shaped with the start value at every step
    c = report.controller(rows)
    assert c["passed"] is False and len(c["stuck"]) == 2
    results = tmp_path / "results"
    results.mkdir()
    (results / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (results / "closed_form.json").write_text(json.dumps(CLOSED))
    assert report.main(["--results", str(results), "--plot", str(tmp_path / "p.png")]) == 0
    verdict = json.loads((results / "summary.json").read_text())["verdict"]
    assert any(line.startswith("BETA DID NOT MOVE in 2 adaptive run(s)") for line in verdict)
    assert "BETA DID NOT MOVE" in (results / "tables.md").read_text()


def test_runs_of_other_lengths_are_scored_apart_each_against_its_own_fixed_reference():
    moving = [1 + 0.01 * i for i in range(STEPS)]
    short = _controller_rows([0.1] * STEPS, moving)
    longer = [_row("fixed", 0.2, [0.1] * 2 * STEPS)]
    for start in (0.1, 0.4):
        longer.append(_row("adaptive", start, [0.5] * 2 * STEPS, phase="controller", target=0.1, ref_beta=0.2,
                           betas=[start * (1 + 0.01 * i) for i in range(2 * STEPS)]))
    c = report.controller(short + longer)
    assert [(t["steps"], t["passed"]) for t in c["targets"]] == [(STEPS, True), (2 * STEPS, False)]
    assert c["passed"] is False and len(c["failed"]) == 2
    lines = report.verdict_lines(report.gate([], CLOSED), c)
    assert any(f"{STEPS} steps" in ln and ": passed on seed(s) [1];" in ln for ln in lines)
    assert any(f"{2 * STEPS} steps" in ln and "NOT passed" in ln for ln in lines)


def test_a_fixed_runs_float_noise_is_not_a_move_but_the_controllers_first_step_is():
    noisy = _row("adaptive", 0.2, [0.1] * STEPS, phase="controller", target=0.1, ref_beta=0.2,
                 betas=[None] + [0.2 * (1 + 8e-8 * (-1) ** i) for i in range(STEPS - 1)])
    assert not report.beta_moved(noisy)
    first = _row("adaptive", 0.2, [0.1] * STEPS, phase="controller", target=0.1, ref_beta=0.2,
                 betas=[None] + [0.2 * (1 - 0.0125)] * (STEPS - 1))
    assert report.beta_moved(first)


def test_a_run_too_short_for_its_horizon_is_not_a_verdict_on_the_controller():
    assert report.steps_to_settle(1024.0) == 112 and report.steps_to_settle(256.0) == 29
    rows = _controller_rows([0.1] * STEPS, [1 + 0.01 * i for i in range(STEPS)])
    for r in rows[1:]:
        r["horizon"] = 1024.0
    c = report.controller(rows)
    assert c["targets"][0]["too_short"] and c["targets"][0]["steps_needed"] == 112
    assert c["passed"] is None  # scored, but not counted as a pass of the controller
    line = next(ln for ln in report.verdict_lines(report.gate([], CLOSED), c) if ln.startswith("Controller"))
    assert "TOO SHORT to judge the controller" in line and "passed" not in line


def test_the_gate_is_judged_per_run_length_and_counts_the_controllers_fixed_runs():
    rows = _gate_rows() + [_row("fixed", 0.2, [0.1] * 2 * STEPS, phase="controller")]
    g = report.gate(rows, CLOSED)
    assert [(grp["table"][0]["steps"], len(grp["table"])) for grp in g["groups"]] == [(STEPS, 3), (2 * STEPS, 1)]
    assert g["table"] == g["groups"][-1]["table"] and not g["passed"]  # the longest: one beta proves no fall
    assert g["groups"][0]["passed"]


def test_the_control_is_reported_beside_the_main_horizon_and_left_out_of_the_pass_line():
    moving = [1 + 0.01 * i for i in range(STEPS)]
    rows = _controller_rows([0.1] * STEPS, moving)
    for start in (0.1, 0.4):  # the control holds the KL worse: it does not make the controller fail
        ctl = _row("adaptive", start, [0.1, 0.2] * (STEPS // 2), phase="control", target=0.1, ref_beta=0.2,
                   betas=[start * (1 + 0.05 * (-1) ** i) for i in range(STEPS)])
        ctl["horizon"] = 16.0
        rows.append(ctl)
    c = report.controller(rows)
    assert c["passed"] and not c["failed"]
    control = c["targets"][0]["control"]
    assert [(x["beta0"], x["passes"]) for x in control] == [(0.1, False), (0.4, False)]
    assert control[0]["main"]["in_band"] == pytest.approx(1.0)
    assert control[0]["beta_swing"] == pytest.approx(1.05 / 0.95)
    lines = report.verdict_lines(report.gate([], CLOSED), c)
    assert sum(ln.startswith("Control (not part of the pass line)") and "horizon 16" in ln for ln in lines) == 2


def test_a_seed_with_one_start_or_without_its_fixed_reference_is_named_not_passed_over():
    moving = [1 + 0.01 * i for i in range(STEPS)]
    rows = _controller_rows([0.1] * STEPS, moving)
    # seed 2: only the start from 0.1; seed 3: both starts but no fixed reference
    rows.append({**_row("adaptive", 0.1, [0.1] * STEPS, phase="controller", target=0.1, ref_beta=0.2,
                        betas=[0.1 * f for f in moving], seed=2)})
    rows.append(_row("fixed", 0.2, [0.1] * STEPS, seed=2))
    for start in (0.1, 0.4):
        rows.append(_row("adaptive", start, [0.1] * STEPS, phase="controller", target=0.1, ref_beta=0.2,
                         betas=[start * f for f in moving], seed=3))
    c = report.controller(rows)
    t = c["targets"][0]
    assert t["missing_starts"] == [(2, 0.4)] and t["unscored"] == [(3, 0.1), (3, 0.4)]
    line = next(ln for ln in report.verdict_lines(report.gate([], CLOSED), c) if ln.startswith("Controller"))
    assert "passed on seed(s) [1, 2]" in line and "INCOMPLETE" in line and "(2, 0.4)" in line
    assert "Not scored" in line and "(3, 0.4)" in line


# ---------------------------------------------------------------- the PR's pages against the recorded runs
# The result tables on the PR's pages (en, zh, the PR description) and the benchmark's page are written by hand;
# every cell must be what the report computes from benchmarks/results/adaptive_kl_slime/runs.jsonl, and "fails"
# must sit where the run fails.
ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/en/advanced/adaptive-kl-controller.md", "docs/zh/advanced/adaptive-kl-controller.md",
         "tools/slime_pr/PR_adaptive_kl.md", "docs/en/advanced/adaptive-kl.md")
CELL = r"(\d\.\d\d) / (\d\.\d\d)(?:(?:, |，)(fails|不合格))?"


@pytest.fixture(scope="module")
def recorded_112_step_lines():
    """The report's scored lines of the recorded 112-step runs, read once for every page."""
    rows, _ = report.load(ROOT / "benchmarks/results/adaptive_kl_slime")
    targets = [t for t in report.controller(rows)["targets"] if t["steps"] == 112]
    return {(t["target"], ln["ctrl"], ln["beta0"], ln["horizon"], ln["seed"]): ln for t in targets for ln in t["rows"]}


def _page_cells(text):
    """{(target, ctrl, start beta, horizon, seed): (in band, mean deviation, marked as failing)} from a table whose
    row opens with the target and the run, in one cell ("target 0.11: fixed 0.2") or two ("0.11 | fixed 0.2"),
    followed by the horizon and one cell per seed."""
    cells = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.split("|")[1:-1]]
        if len(cols) < 5:
            continue
        if re.fullmatch(r"[\d.]+", cols[0]):  # the benchmark page: the target has a column of its own
            cols = [f"target {cols[0]}: {cols[1]}", *cols[2:]]
        m = re.match(r"(?:target|目标) ([\d.]+)[:：] ?(fixed|固定|adaptive|自适应)\D*?([\d.]+)", cols[0])
        if not m:
            continue
        target, ctrl, beta = float(m.group(1)), m.group(2), float(m.group(3))
        ctrl = "fixed" if ctrl in ("fixed", "固定") else "adaptive"
        horizon = None if ctrl == "fixed" else float(re.match(r"\d+", cols[1]).group())
        for seed, cell in enumerate(cols[2:5], start=1):
            c = re.fullmatch(CELL, cell)
            if c:
                cells[(target, ctrl, beta, horizon, seed)] = (float(c.group(1)), float(c.group(2)), bool(c.group(3)))
    return cells


@pytest.mark.parametrize("page", PAGES)
def test_the_prs_result_table_is_what_the_recorded_runs_give(page, recorded_112_step_lines):
    recorded = recorded_112_step_lines
    cells = _page_cells((ROOT / page).read_text())
    assert len(cells) == 20, sorted(cells)  # per target: the fixed reference and 2 starts on 3 seeds; 2 controls
    for key, (in_band, dev, fails) in cells.items():
        ln = recorded[key]
        assert (in_band, dev) == (round(ln["in_band"], 2), round(ln["dev"], 2)), (page, key)
        if ln["ctrl"] == "adaptive" and ln["phase"] == "controller":
            assert fails == (not ln["passes"]), (page, key)
