"""Step-time breakdown of train.py runs from their metrics.jsonl, and peak memory of a run.

Phases per step, as shares of ``time/step``: rollout (``time/generate``), teacher scoring
(``time/reward``, server teacher), log-prob recomputation (``time/train_logprobs``: old / ref / in-trainer
teacher forwards and advantages), training update (``time/train_update``), weight sync, save, and
orchestration = step minus all of those (rollout manager bookkeeping, Ray dispatch and sample
transfer to the trainer, metrics). Runs that predate the trainer's sub-timings show the whole of
``time/train`` as the update. Steps that ran an evaluation are left out (their eval time is inside
``time/step`` but not logged as a phase), and so are the first ``--skip`` steps (warm-up).

    python benchmarks/step_breakdown.py RUN/metrics.jsonl [...] [--plot PATH]
    python benchmarks/step_breakdown.py --measure -- python train.py ... --metrics-dir DIR
        # runs the command, samples the proportional set size (PSS) of its whole process tree
        # (Ray workers and engine servers included) every --interval seconds, prints the peak,
        # then the breakdown of DIR/metrics.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

PHASES = [("rollout", "time/generate"), ("teacher", "time/reward"), ("log-probs", "time/train_logprobs"),
          ("update", "time/train_update"), ("weight sync", "time/weight_sync"), ("save", "time/save")]


def step_records(path, skip: int):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "time/step" in r]
    steps = steps[skip:]
    kept = [r for r in steps if not any(k.startswith("eval/") for k in r)]
    return kept, len(steps) - len(kept)


def phase_times(r: dict) -> dict:
    out = {name: float(r.get(key, 0.0) or 0.0) for name, key in PHASES}
    if "time/generate" not in r:  # rollout functions that record no phases: the whole rollout
        out["rollout"] = float(r.get("time/rollout", 0.0))
    if "time/train_update" not in r:  # older runs: no split of time/train
        out["update"] = float(r.get("time/train", 0.0))
    out["orchestration"] = float(r["time/step"]) - sum(out.values())
    return out


def breakdown(path, skip: int) -> dict | None:
    kept, evals = step_records(path, skip)
    if not kept:
        return None
    per = [phase_times(r) for r in kept]
    step = statistics.mean(float(r["time/step"]) for r in kept)
    means = {k: statistics.mean(p[k] for p in per) for k in per[0]}
    return {"steps": len(kept), "eval_steps": evals, "step": step, "means": means,
            "split": all("time/train_update" in r for r in kept)}


def print_table(results: dict) -> None:
    names = [n for n, _ in PHASES] + ["orchestration"]
    print("| run | steps (eval steps left out) | step (s) | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for label, b in results.items():
        shares = " | ".join(f"{b['means'][n]:.2f}s {100 * b['means'][n] / b['step']:.0f}%" for n in names)
        note = "" if b["split"] else " (no train split)"
        print(f"| {label}{note} | {b['steps']} ({b['eval_steps']}) | {b['step']:.2f} | {shares} |")


def plot(results: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, _ in PHASES] + ["orchestration"]
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(results) + 1.8))
    labels = list(results)
    left = [0.0] * len(labels)
    for name in names:
        widths = [100 * results[l]["means"][name] / results[l]["step"] for l in labels]
        ax.barh(labels, widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("share of step time (%)")
    ax.set_title("train.py step-time breakdown")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ------------------------------------------------------------------ memory of a process tree (Linux /proc)
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                # The command name is in parentheses and may contain spaces: split after the last ')'.
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _pss_kib(pid: int) -> int:
    # PSS splits shared pages among the processes mapping them, so the tree's sum does not double count.
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _name(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in cmd if w]
    if "-m" in words:
        return words[words.index("-m") + 1]
    return Path(words[0]).name if words else "?"


def measure(cmd: list[str], interval: float):
    proc = subprocess.Popen(cmd)
    peak = {"total": 0, "by_name": Counter()}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            by = Counter()
            for pid in _tree(proc.pid):
                by[_name(pid)] += _pss_kib(pid)
            if sum(by.values()) > peak["total"]:
                peak["total"], peak["by_name"] = sum(by.values()), by
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    thread.start()
    rc = proc.wait()
    stop.set()
    thread.join()
    return rc, time.perf_counter() - start, peak


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = []
    if "--" in argv:
        cmd, argv = argv[argv.index("--") + 1:], argv[: argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics", nargs="*", help="metrics.jsonl files")
    p.add_argument("--measure", action="store_true", help="run the command after -- and sample its memory")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--skip", type=int, default=1, help="warm-up steps left out")
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    paths = list(a.metrics)
    if a.measure:
        if not cmd:
            p.error("--measure needs a command after --")
        rc, wall, peak = measure(cmd, a.interval)
        top = ", ".join(f"{n} {kib / 2**20:.2f}" for n, kib in peak["by_name"].most_common(6))
        print(f"command exited {rc} after {wall:.0f} s; peak PSS of the process tree "
              f"{peak['total'] / 2**20:.2f} GiB (GiB at that moment: {top})")
        if "--metrics-dir" in cmd and not paths:
            paths = [str(Path(cmd[cmd.index("--metrics-dir") + 1]) / "metrics.jsonl")]
    results = {}
    for path in paths:
        b = breakdown(path, a.skip)
        if b is None:
            print(f"{path}: no training steps left after --skip {a.skip} and eval steps", file=sys.stderr)
            continue
        path = Path(path)
        # Label: the run's last two folders (train.py writes metrics.jsonl), else the file's own stem.
        results["/".join(path.parts[-3:-1]) if path.name == "metrics.jsonl" else path.stem] = b
    if results:
        print_table(results)
        if a.plot:
            plot(results, a.plot)
            print(f"plot written to {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
