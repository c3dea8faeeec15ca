"""The lines a ``--load`` prints before Ray (or with the ``--dry-run`` plan): what is resumed, and how.

The checks themselves (what may not change, the verified iteration) are ``slime.checkpoint.resume``'s;
this module words the result. It lives in the launch layer because the resume line names the TCOD depth
the run continues at (``slime.rollout.tcod``), which the checkpoint layer below the rollout may not import.
"""

from __future__ import annotations

from pathlib import Path

from slime.checkpoint.resume import KEEP, OVERRIDE, arrow, check_resume, show
from slime.checkpoint.run_config import RUN_CONFIG
from slime.rollout.tcod import curriculum_depth


def resume_notes(args) -> list[str]:
    """Refuse (``ArgumentError``) a resume that changes the run; returns the lines to print, the resume line first."""
    if not args.load:
        return []
    resume = check_resume(args)
    if resume is None:
        return [f"--load {args.load} holds no checkpoint yet: starting from step 0"]
    notes = [resume_line(args, resume.folder, resume.step)]
    if resume.optimizer and args.override_opt_param_scheduler:
        notes.append(f"{OVERRIDE}: the restored optimizer takes this run's settings: "
                     + ", ".join(arrow(*c) for c in resume.optimizer))
    elif resume.optimizer:
        notes.append(f"{KEEP}: the checkpoint's optimizer settings are kept: "
                     + ", ".join(f"{flag} {show(old)} (this run's {show(new)} is ignored)"
                                 for flag, old, new in resume.optimizer))
    if resume.kl_settings:
        notes.append("the saved KL coefficient goes on with this run's " + ", ".join(
            arrow(flag, *values) for flag, values in resume.kl_settings.items()))
    if not resume.has_run_config:
        notes.append(f"--load {args.load}: {resume.folder.name} has no {RUN_CONFIG} (written before run "
                     "configurations were saved): its flags could not be compared with this run's")
    return notes


def resume_line(args, folder: Path, step: int) -> str:
    where = folder if Path(args.load).resolve() == folder.resolve() else f"{args.load} ({folder.name})"
    line = f"resuming from iteration {step} of {where}: the next rollout step is {step + 1}"
    if step + 1 >= args.num_rollout:
        return line + f", but --num-rollout {args.num_rollout} ends before it: nothing is left to train"
    if args.use_tcod:
        depth = curriculum_depth(step + 1, args.tcod_k_start, args.tcod_eta, args.tcod_k_max)
        line += f"; the TCOD curriculum continues at depth k({step + 1}) = {depth}"
    return line
