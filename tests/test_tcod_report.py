"""The demo's report: start/end numbers from metrics records, a skipped step -1 eval, and the plot."""

from scripts.tcod_report import figure, gap_closed, headline, main, markdown_table, mean_per_turn_kl, plot, summarize


def _records():
    out = []
    for step in range(6):
        record = {"step": step, "multi_turn/success_rate": step / 5, "opd/trajectory_kl_mean": 6.0 - step,
                  "opd/per_turn_kl": [1.0, None, 3.0][: 1 + step % 3], "time/step": 2.0,
                  "rollout/trained_tokens": 10}
        if step in (2, 5):
            record["eval/gridnav/success_rate"] = step / 10
        out.append(record)
    return out


def test_summarize_uses_step_windows_and_start_eval():
    s = summarize(_records(), start_eval=0.05)
    assert s["steps"] == 6
    assert s["eval_success_start"] == 0.05 and s["eval_success_end"] == 0.5
    assert abs(s["train_success_start"] - 0.2) < 1e-9  # mean of steps 0..2
    assert abs(s["traj_kl_end"] - 2.0) < 1e-9  # mean of steps 3..5
    assert s["wall_time_s"] == 12.0 and s["trained_tokens"] == 60
    # A logged step -1 evaluation wins over the stand-in value.
    with_start = [{"step": -1, "eval/gridnav/success_rate": 0.3}] + _records()
    assert summarize(with_start, start_eval=0.05)["eval_success_start"] == 0.3
    assert "| run |" in markdown_table({"x": s})


def _summary(start, end, tokens):
    return {"steps": 40, "train_success_start": 0.23333333, "train_success_end": 0.5, "eval_success_start": start,
            "eval_success_end": end, "traj_kl_start": 9.5625, "traj_kl_end": 3.1406, "wall_time_s": 142.71,
            "trained_tokens": tokens}


def test_gap_closed_is_the_share_of_the_teacher_student_gap():
    assert abs(gap_closed(0.2916666666666667, 0.5625, 0.75) - 0.5909090909) < 1e-9
    assert gap_closed(0.3, 0.3, 0.9) == 0.0
    assert gap_closed(0.5, 0.6, 0.5) is None  # the teacher is not ahead: no gap to close
    assert gap_closed(0.3, None, 0.9) is None and gap_closed(0.3, 0.5, None) is None


def test_the_table_carries_each_runs_gap_share_beside_the_figures_it_comes_from():
    runs = {"vanilla OPD": _summary(0.2916666666666667, 0.5625, 24834),
            "TCOD-F2B": _summary(0.2916666666666667, 0.46875, 17736)}
    lines = markdown_table(runs, teacher_success=0.7083333333333334).splitlines()
    assert lines[0] == ("| run | steps | eval success: teacher | student at start -> end | gap closed | "
                        "train success start -> end | trajectory KL start -> end | wall time (s) | trained tokens |")
    # Rounded for people: two decimals, whole percent, thousands separators; tokens against the first run.
    assert lines[2] == ("| vanilla OPD | 40 | 0.71 | 0.29 -> 0.56 | 65% | 0.23 -> 0.50 | 9.56 -> 3.14 | 143 | "
                        "24,834 |")
    assert lines[3].startswith("| TCOD-F2B | 40 | 0.71 | 0.29 -> 0.47 | 42% |")  # 42.5%, rounded half to even
    assert lines[3].endswith("| 17,736 (-29%) |")
    # No teacher figure: no share; a teacher behind the student: said so.
    assert "| - | 0.29 -> 0.56 | - |" in markdown_table(runs)
    assert "| 0.20 | 0.29 -> 0.56 | no gap |" in markdown_table(runs, teacher_success=0.2)


def test_the_headline_names_every_share_with_its_figures_in_one_line():
    runs = {"vanilla OPD": _summary(0.29, 0.56, 1), "TCOD-F2B": _summary(0.29, 0.47, 1)}
    assert headline(runs, 0.75, tasks=96) == [
        "gap closed on 96 held-out tasks, from the student's 0.29 toward the teacher's 0.75: vanilla OPD 59% (to "
        "0.56), TCOD-F2B 39% (to 0.47)"]
    # Runs from different starting points: one line each, with its own start.
    runs["TCOD-F2B"]["eval_success_start"] = 0.5
    assert headline(runs, 0.75)[1] == "TCOD-F2B closed -12% of the gap on the held-out tasks: 0.50 -> 0.47, teacher 0.75"
    assert headline(runs, None) == []


def test_evaluations_are_drawn_as_points_not_a_line():
    fig = figure({"a": _records(), "b": _records()}, teacher_success=0.9, start_eval=0.1)
    evals = [line for line in fig.axes[0].get_lines() if "eval (full episodes" in line.get_label()]
    assert [line.get_label() for line in evals] == ["a eval (full episodes, 50% of the gap)",
                                                    "b eval (full episodes, 50% of the gap)"]
    for line in evals:
        assert line.get_linestyle() == "None" and line.get_marker() not in (None, "None", "")
        assert list(line.get_xdata()) == [-1, 2, 5]
    assert evals[0].get_marker() != evals[1].get_marker()  # equal points of two runs stay apart


def test_main_prints_the_table_the_summary_and_the_paths_it_wrote(tmp_path, capsys):
    _write_run(tmp_path / "opd", _records())
    md, png = tmp_path / "out" / "table.md", tmp_path / "out" / "p.png"
    (tmp_path / "out").mkdir()
    assert main(["--run", "vanilla OPD", str(tmp_path / "opd/metrics.jsonl"), "--teacher-success", "0.9",
                 "--start-eval", "0.1", "--eval-tasks", "96", "--md", str(md), "--png", str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [f"table: {md}", f"plot: {png}"]
    assert "gap closed on 96 held-out tasks, from the student's 0.10 toward the teacher's 0.90: vanilla OPD 50% " \
           "(to 0.50)" in out
    assert md.read_text().splitlines()[2].startswith("| vanilla OPD | 6 | 0.90 | 0.10 -> 0.50 | 50% |")
    assert png.stat().st_size > 1000


def test_per_turn_mean_skips_missing_turns():
    assert mean_per_turn_kl([{"opd/per_turn_kl": [1.0, None]}, {"opd/per_turn_kl": [3.0, 4.0]}]) == [2.0, 4.0]


def test_plot_writes_png(tmp_path):
    png = tmp_path / "p.png"
    plot({"a": _records(), "b": _records()}, png, teacher_success=0.9, start_eval=0.1)
    assert png.stat().st_size > 1000


def _write_run(path, records):
    import json

    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_sweep_report_averages_eval_curves_and_skips_unfinished_runs(tmp_path):
    from benchmarks.tcod_vs_opd_report import eval_curve, load, table

    for seed, shift in ((0, 0.0), (1, 0.2)):
        records = _records()
        for r in records:
            if "eval/gridnav/success_rate" in r:
                r["eval/gridnav/success_rate"] += shift
        _write_run(tmp_path / f"seed{seed}" / "opd", records)
    # Evaluated at step 2 but stopped before its last step (5): unfinished, so not counted.
    _write_run(tmp_path / "seed2" / "opd", _records()[:4])
    runs = load(tmp_path)
    assert sorted(runs["opd"]) == [0, 1] and runs["f2b"] == {}
    curve = eval_curve(runs["opd"], start_eval=0.1)
    assert [step for step, _, _ in curve] == [-1, 2, 5]
    assert abs(curve[1][1] - 0.3) < 1e-9 and abs(curve[2][1] - 0.6) < 1e-9  # (0.2 + 0.4) / 2, (0.5 + 0.7) / 2
    assert curve[0][2] == 0.0  # the shared start has no spread
    md, summary = table(runs, start_eval=0.1)
    assert "start: 0.10, 2: 0.30, 5: 0.60" in md
    assert summary["vanilla OPD"]["eval_curve"] == curve


def test_demo_seeds_report_gives_each_method_its_share_of_the_gap(tmp_path):
    import json

    from benchmarks.demo_seeds_report import seed_row, table

    for seed, (teacher, student, opd) in enumerate(((0.9, 0.3, 0.6), (0.4, 0.5, 0.45))):
        (tmp_path / f"seed{seed}.log").write_text(
            "=== [   4s] 2/5 SFT on expert trajectories: teacher (90 steps), student (checkpoint at 20)\n")
        sft = tmp_path / f"seed{seed}" / "sft"
        sft.mkdir(parents=True)
        (sft / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "eval/gridnav/success_rate": v}) + "\n"
                                                   for s, v in ((19, student), (39, 0.0), (89, teacher))))
        for name, end in (("opd", opd), ("f2b", student), ("b2f", teacher)):
            _write_run(tmp_path / f"seed{seed}" / name, [{"step": 0, "eval/gridnav/success_rate": end}])
    rows = [seed_row(tmp_path, 0), seed_row(tmp_path, 1)]
    assert (rows[0]["teacher"], rows[0]["student"]) == (0.9, 0.3)  # the steps the demo's log names, not step 39
    assert abs(rows[0]["opd_closed"] - 0.5) < 1e-9 and rows[0]["f2b_closed"] == 0 and abs(rows[0]["b2f_closed"] - 1) < 1e-9
    assert rows[1]["opd_closed"] is None  # teacher behind its student: no gap to close
    text = table(rows)
    assert "0.60 (50% of the gap)" in text and "No teacher-student gap (left out of the mean): seed 1." in text


def test_demo_variants_report_finds_where_a_run_parts_from_the_recorded_one(tmp_path, monkeypatch):
    import json

    import benchmarks.demo_variants_report as report

    def rows(losses, evals):
        return [{"step": s, "time": 100.0 + s, "perf/step_s": 1.0 + s, "loss": loss,
                 **({"eval/gridnav/success_rate": evals[s]} if s in evals else {})} for s, loss in enumerate(losses)]

    recorded = tmp_path / "recorded" / "seed0"
    recorded.mkdir(parents=True)
    for name, data in (("sft", rows([3.5, 2.0, 1.5], {1: 0.2, 2: 0.8})), ("opd", rows([1.0, 0.5], {1: 0.5}))):
        (recorded / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    monkeypatch.setattr(report, "RECORDED", tmp_path / "recorded")
    out = tmp_path / "out"
    for variant, sft_losses, opd_end in (("native", [3.5, 2.0, 1.5], 0.5),
                                         ("avx2", [3.5, 2.0000001, 1.5], 0.35)):
        (out / variant).mkdir(parents=True)
        (out / variant / "seed0.log").write_text(
            "=== [   4s] 2/5 SFT on expert trajectories: teacher (3 steps), student (checkpoint at 2)\n")
        run = out / variant / "seed0"
        _write_run(run / "sft", rows(sft_losses, {1: 0.2, 2: 0.8}))
        _write_run(run / "opd", rows([1.0, 0.5], {1: opd_end}))
    native, avx2 = report.run_row(out, "native", 0), report.run_row(out, "avx2", 0)
    assert native["sft_parts_at"] is None and native["opd_differs"] == []  # timings differ on every run: left out
    assert avx2["sft_parts_at"] == 1 and avx2["opd_differs"] == ["eval/gridnav/success_rate"]
    assert abs(native["closed"] - 0.5) < 1e-9 and abs(avx2["closed"] - 0.25) < 1e-9  # (end - 0.2) / (0.8 - 0.2)
    text = report.table([native, avx2])
    assert "| native | 0 | 0.80 / 0.20 | 0.50 (50%) | never | yes |" in text
    assert "| avx2 | 0 | 0.80 / 0.20 | 0.35 (25%) | 1 | all but eval/gridnav/success_rate |" in text
    assert "above half in 0 of 2" in text
