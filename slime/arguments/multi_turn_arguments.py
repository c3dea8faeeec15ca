"""Multi-turn rollout settings and upstream's ``--custom-config-path`` / rollout-log hook (runtime flags).

Upstream slime has no flags for the multi-turn settings: its multi-turn examples read ``max_turns``,
``rollout_interaction_env_path`` and the like from the YAML given to ``--custom-config-path``, which
``slime_validate_args`` applies key by key onto ``args``. This runtime accepts both: the flags below, and
the same YAML with the same semantics (a key in the YAML overrides the flag).
"""

from __future__ import annotations

import math

from slime.arguments.argument_error import fail as _fail
from slime.arguments.custom_config import apply_custom_config
from slime.utils.tcod_arguments import add_tcod_arguments, validate_tcod_args

DEFAULT_ENV_STEP_TIMEOUT = 300.0


def add_multi_turn_arguments(parser):
    g = parser.add_argument_group("multi-turn rollout (upstream: keys of the --custom-config-path YAML)")
    g.add_argument("--max-turns", type=int, default=None, help="student turns per episode (multi-turn rollout)")
    g.add_argument("--max-turn-response-len", type=int, default=None,
                   help="token limit of one student turn (default: --rollout-max-response-len, which also bounds "
                        "the whole trajectory, observations included)")
    g.add_argument("--rollout-interaction-env-path", type=str, default=None,
                   help="the environment: a module (dotted path or .py file) exposing build_env(sample, args), "
                        "upstream's contract")
    g.add_argument("--env-step-timeout", type=float, default=DEFAULT_ENV_STEP_TIMEOUT,
                   help="seconds one environment call (build, reset, step, close) may take; a call that "
                        "takes longer ends its episode as failed and the run goes on")
    g.add_argument("--custom-config-path", type=str, default=None,
                   help="YAML whose keys are set on args before validation, as upstream slime does "
                        "(e.g. examples/multi_turn_tcod/multi_turn_tcod_config.yaml)")
    g.add_argument("--custom-rollout-log-function-path", type=str, default=None,
                   help="upstream's rollout-log hook log_rollout_data(rollout_id, args, samples, "
                        "rollout_extra_metrics, rollout_time) -> bool; what it adds to rollout_extra_metrics "
                        "is logged with the step's metrics")
    g.add_argument("--turns-per-step", type=int, default=None,
                   help="fill every rollout step with at least N trained student turns (at most one episode "
                        "group more), drawing episodes in waves, and train them in one optimizer step: the "
                        "official TCOD configs' turn-level batches, the same for every method. "
                        "--rollout-batch-size is then unused; the step's counts are logged as rollout/episodes, "
                        "rollout/student_turns and rollout/waves")
    g.add_argument("--tcod-prefix-source", choices=("expert", "teacher"), default=None,
                   help="b2f only: where the replayed prefix comes from. expert (default): the task's expert "
                        "actions, L = their number; teacher: the teacher server's own episode of the task, played "
                        "once, cached (and checkpointed) and replayed, L = its length (no expert data needed)")
    return parser


EXAMPLE_GENERATE = "examples.multi_turn_tcod.rollout.generate"
TEACHER_PREFIX_GENERATE = "slime.rollout.teacher_prefix.generate"


def validate_prefix_source(args) -> None:
    """This runtime's B2F prefix sources (after the --tcod-* checks have filled --tcod-mode)."""
    if args.tcod_prefix_source is not None and not args.use_tcod:
        _fail("--tcod-prefix-source is set but --use-tcod is not")
    if not args.use_tcod or args.tcod_mode != "b2f":
        if args.tcod_prefix_source is not None:
            _fail("--tcod-prefix-source applies to --tcod-mode b2f only; f2b always plays from reset")
        return
    args.tcod_prefix_source = args.tcod_prefix_source or "expert"
    if args.tcod_prefix_source == "teacher":
        if args.opd_type != "sglang" or not args.rm_url:
            # An in-trainer teacher only scores: the rollout side cannot ask it to play an episode.
            _fail("--tcod-prefix-source teacher needs a teacher server that can generate: --opd-type sglang with "
                  "--rm-url (an in-trainer teacher, --opd-type megatron, only scores)")
        # The example's agent loop takes its prefix source as a parameter; the teacher's is this runtime's
        # wrapper of it. Unset, the agent loop is what slime.launch.checks would default to.
        chosen = args.custom_generate_function_path
        if chosen not in (None, EXAMPLE_GENERATE, TEACHER_PREFIX_GENERATE):
            _fail(f"--tcod-prefix-source teacher plays episodes through {TEACHER_PREFIX_GENERATE} (the example's "
                  f"agent loop with teacher-played prefixes); --custom-generate-function-path {chosen} would "
                  "ignore it: drop that flag or use --tcod-prefix-source expert")
        if chosen != TEACHER_PREFIX_GENERATE:
            import logging

            logging.getLogger(__name__).info(
                "--tcod-prefix-source teacher: --custom-generate-function-path %s (was %s)",
                TEACHER_PREFIX_GENERATE, chosen)
            args.custom_generate_function_path = TEACHER_PREFIX_GENERATE


def validate_multi_turn_args(args) -> None:
    apply_custom_config(args)
    for name in ("max_turns", "max_turn_response_len"):
        value = getattr(args, name, None)
        if value is not None and not (isinstance(value, int) and value >= 1):
            _fail(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
    timeout = args.env_step_timeout
    if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
        _fail(f"--env-step-timeout must be a finite number of seconds > 0, got {timeout!r}")
    if args.max_turn_response_len is None:
        args.max_turn_response_len = args.rollout_max_response_len
    if args.max_turns is not None and not args.rollout_interaction_env_path:
        _fail("--max-turns is set but --rollout-interaction-env-path is not: name the environment")


def validate_turns_per_step(args) -> None:
    """``--turns-per-step``: one optimizer step per rollout over a variable number of episodes."""
    if args.turns_per_step is None:
        return
    if args.turns_per_step < 1:
        _fail(f"--turns-per-step must be >= 1, got {args.turns_per_step}")
    if not args.max_turns:
        _fail("--turns-per-step counts the turns of multi-turn episodes: set max_turns (--custom-config-path "
              "or --max-turns)")
    if args.num_steps_per_rollout != 1:
        _fail(f"--turns-per-step trains each rollout step in one optimizer step; --global-batch-size / "
              f"--num-steps-per-rollout give {args.num_steps_per_rollout}: drop them")


def add_tcod_group(parser):
    # The same function upstream's parser gets from port.py, in a group of its own for --help.
    add_tcod_arguments(parser.add_argument_group("TCOD temporal curriculum"))
    return parser


def validate_multi_turn_tcod_args(args):
    """The YAML, the multi-turn flags, upstream's --tcod-* checks, then this runtime's prefix sources."""
    validate_multi_turn_args(args)
    # slime.launch.checks defaults the generate function to the agent loop after validation (and says so); the
    # check below, upstream's, refuses --use-tcod without one, so it sees that default here.
    defaulted = args.use_tcod and args.custom_generate_function_path is None
    args.custom_generate_function_path = EXAMPLE_GENERATE if defaulted else args.custom_generate_function_path
    try:
        validate_tcod_args(args)  # the same checks upstream runs (port.py splices them into slime_validate_args)
    except ValueError as err:
        _fail(str(err))
    finally:
        args.custom_generate_function_path = None if defaulted else args.custom_generate_function_path
    if args.use_tcod:  # upstream leaves --tcod-k-max to the generate function's max_turns; here it is a flag
        if not args.max_turns:
            _fail("--use-tcod needs max_turns (--max-turns or the --custom-config-path YAML): a multi-turn rollout")
        args.tcod_k_max = args.tcod_k_max or args.max_turns
        if args.tcod_k_max > args.max_turns:
            _fail(f"--tcod-k-max ({args.tcod_k_max}) must be <= max_turns ({args.max_turns})")
    validate_prefix_source(args)
    validate_turns_per_step(args)
