"""The lines a user reads at the end of a run and in the plan say what they mean: steps are counted ("3 of 3
steps"), and the plan's checkpoint line names what is saved, never ``every None``."""

from types import SimpleNamespace

from slime.launch.plan import _checkpoint_plan
from slime.ray.run_summary import RunProgress


def test_the_last_line_counts_steps_and_names_the_last_one(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("{}\n")
    progress = RunProgress(3, checkpoint=None)
    progress.metrics = metrics
    assert progress.summary("interrupted") == f"interrupted: 0 of 3 steps, last checkpoint none, metrics {metrics}"
    for step in range(3):
        progress.logged(step)
    progress.saved(tmp_path / "iter_0000002")
    assert progress.summary("done") == (f"done: 3 of 3 steps (last: step 2), last checkpoint {tmp_path}/iter_0000002, "
                                        f"metrics {metrics}")


def test_the_plans_checkpoint_line_never_says_every_none():
    def line(**kw):
        return _checkpoint_plan(SimpleNamespace(**{"save": None, "save_interval": None, "load": None, **kw}))

    assert line() == "none saved (no --save); starts fresh (no --load)"
    assert line(save="/c") == "none saved: --save /c without --save-interval; starts fresh (no --load)"
    assert line(save="/c", save_interval=5, load="/c") == ("to /c every 5 step(s) and after the last; resumes from "
                                                          "--load /c")
