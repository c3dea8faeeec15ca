"""The one entry from parsed arguments to Ray: ``train.py`` calls :func:`prepare_run` and starts Ray only
when it lets the run go on.

What it does, in the order a run meets it (every refusal is one line, ``train.py: error: MESSAGE``, exit 2):

1. ``checks.check_launch`` (plugins, data rows and their environments, output folders, ``--rm-url``, YAML
   keys, resume); the defaults it takes and its warnings come back as notes. ``--dry-run`` runs the
   pre-flight of step 4 too, prints the plan with the notes (``plan.print_plan``) and ends here, exit 0;
2. the notes on stderr, one ``train.py: NOTE`` line each;
3. without ``--save`` or ``--metrics-dir``, a new ``outputs/run-DATE-TIME`` folder, named on stderr; then the
   output folders' lock (``output_paths.OutputLock``), held until the ``with`` block ends;
4. logging configured, then ``preflight.preflight``: model folders and shape, prompt files with the
   tokenizer, teacher vocabulary, the verified ``--load`` iteration. A refusal here releases the lock and
   removes the lock files and the (empty) folders the lock made;
5. a resumed run's engines are pointed at the checkpoint's policy (``args.rollout_model_path``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass

from slime.arguments.argument_error import ArgumentError
from slime.launch.checks import check_launch
from slime.launch.output_paths import OutputLock, default_metrics_dir, discard_unused
from slime.launch.plan import print_plan
from slime.launch.preflight import Inputs, preflight
from slime.utils.misc import heartbeat

# Every wait before Ray says it is one (each line after 10 s of it); a quick refusal prints only its own line.
CHECKING = "train.py: still checking the inputs; nothing is started yet"


@dataclass
class Prepared:
    exit_code: int | None  # set: the run ends here with it (2: refused, 0: --dry-run's plan printed)
    inputs: Inputs | None = None  # what the run starts from: the tokenizer, the verified --load folder


def _refused(err: ArgumentError) -> Prepared:
    print(f"train.py: error: {err}", file=sys.stderr)
    return Prepared(exit_code=2)


@contextlib.contextmanager
def prepare_run(args):
    """Yields a :class:`Prepared`; the run goes on inside the ``with`` block when its ``exit_code`` is None."""
    try:
        # Plugins, data files and budgets: a misconfiguration fails here, not after Ray and the engines are up.
        with heartbeat(CHECKING):
            notes = check_launch(args)
    except ArgumentError as err:
        yield _refused(err)
        return
    if args.dry_run:
        try:
            # The real run's pre-flight too (models, tokenizer, teacher, the verified --load): a plan is
            # printed only for a run that would start.
            with heartbeat(CHECKING):
                preflight(args)
        except ArgumentError as err:
            yield _refused(err)
            return
        if args.model_config_json:
            notes.append(f"note: --model-config-json given: the model folders (--hf-checkpoint "
                         f"{args.hf_checkpoint}) and their tokenizer were not checked; the real run checks "
                         "them before Ray")
        print_plan(args, notes)
        yield Prepared(exit_code=0)
        return
    for note in notes:
        print(f"train.py: {note}", file=sys.stderr)
    try:
        fresh = default_metrics_dir(args)
        if fresh is not None:
            print(f"train.py: no --save or --metrics-dir: this run writes to {fresh}", file=sys.stderr)
        lock = OutputLock(args)  # a second run into these folders is refused until this one ends
    except ArgumentError as err:
        yield _refused(err)
        return
    try:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            with heartbeat(CHECKING):
                inputs = preflight(args)
        except ArgumentError as err:
            lock.discard()  # a refused run leaves no lock, nor the folders the lock made
            discard_unused(fresh)
            yield _refused(err)
            return
        if inputs.load_folder is not None:
            # Engines start on the restored policy, so rollouts of the next step use the checkpoint's weights.
            args.rollout_model_path = str(inputs.load_folder / "model" / "hf")
        yield Prepared(exit_code=None, inputs=inputs)
    finally:
        lock.release()
