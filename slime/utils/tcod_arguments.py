"""Flags of multi-turn rollouts and of TCOD's temporal curriculum, and their validation.

Part of the slime contribution: upstream slime registers these through
``examples/multi_turn_tcod/upstream/port.py``, which adds :func:`add_multi_turn_tcod_arguments` to the
parser built in ``slime/utils/arguments.py`` and runs :func:`validate_multi_turn_tcod_args` after
``slime_validate_args`` (so values set by upstream's ``--custom-config-path`` YAML are validated too).
This project's runtime calls the same two functions.

Every rejection raises ``ValueError`` whose message names the flag and the fix.
"""

from __future__ import annotations

import math

# The rollout function that attaches each step's episode plan; the default one does not (see tcod.py).
TCOD_ROLLOUT_FUNCTION_PATH = "slime.rollout.tcod.generate_rollout"
DEFAULT_ROLLOUT_FUNCTION_PATH = "slime.rollout.sglang_rollout.generate_rollout"


def add_multi_turn_arguments(parser):
    g = parser.add_argument_group("multi-turn rollout")
    g.add_argument("--max-turns", type=int, default=None, help="student turns per episode (multi-turn rollout)")
    g.add_argument("--max-turn-response-len", type=int, default=None,
                   help="token limit of one student turn (default: --rollout-max-response-len)")
    g.add_argument("--rollout-interaction-env-path", type=str, default=None,
                   help="the environment: a module exposing build_env(sample, args) (upstream's contract) "
                        "or the dotted path of a factory make_env(args, sample)")
    g.add_argument("--env-step-timeout", type=float, default=300.0,
                   help="seconds one environment call (build, reset, step, close) may take; a call that "
                        "takes longer ends its episode as failed and the run goes on")
    return parser


def add_tcod_arguments(parser):
    g = parser.add_argument_group("TCOD temporal curriculum")
    g.add_argument("--use-tcod", action="store_true", help="grow the trajectory depth from short to long")
    g.add_argument("--tcod-mode", choices=("f2b", "b2f"), default="f2b")
    g.add_argument("--tcod-k-start", type=int, default=1)
    g.add_argument("--tcod-eta", type=int, default=None, help="rollout steps per depth increment (required)")
    g.add_argument("--tcod-k-max", type=int, default=None, help="largest depth (default: --max-turns)")
    g.add_argument("--tcod-prefix-source", choices=("expert", "teacher"), default=None,
                   help="b2f only: where the replayed prefix comes from. expert (default): the task's expert "
                        "actions, L = their number; teacher: the teacher server's own episode of the task, "
                        "played once, cached and replayed, L = its length (no expert data needed)")
    return parser


def add_multi_turn_tcod_arguments(parser):
    """Both groups; returns the parser, as upstream's argument hooks do."""
    return add_tcod_arguments(add_multi_turn_arguments(parser))


def _positive(args, name: str) -> None:
    value = getattr(args, name, None)
    if value is not None and not value >= 1:  # `not >=` also rejects NaN
        raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def validate_multi_turn_tcod_args(args) -> None:
    """Check the multi-turn and TCOD flags and fill their derived defaults, in place.

    Reads every flag with ``getattr``: upstream's own tests call ``slime_validate_args`` on hand-built
    argument objects that never heard of these flags, and those must pass untouched.
    """
    def flag(name, default=None):
        return getattr(args, name, default)

    for name in ("max_turns", "max_turn_response_len"):
        _positive(args, name)
    timeout = flag("env_step_timeout")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):  # NaN fails both
        raise ValueError(f"--env-step-timeout must be a finite number of seconds > 0, got {timeout}")
    if flag("max_turn_response_len") is None and flag("rollout_max_response_len") is not None:
        args.max_turn_response_len = args.rollout_max_response_len
    if flag("max_turns") is not None and not flag("rollout_interaction_env_path"):
        raise ValueError("--max-turns is set but --rollout-interaction-env-path is not: name the environment")
    if not flag("use_tcod", False):
        if flag("tcod_prefix_source") is not None:
            raise ValueError("--tcod-prefix-source is set but --use-tcod is not")
        return
    if not flag("use_opd", False):
        raise ValueError("--use-tcod shapes on-policy distillation: add --use-opd (and --opd-type)")
    if flag("max_turns") is None:
        raise ValueError("--use-tcod needs a multi-turn rollout: set --max-turns and --rollout-interaction-env-path")
    if flag("rollout_function_path") == DEFAULT_ROLLOUT_FUNCTION_PATH:
        raise ValueError(f"--use-tcod needs --rollout-function-path {TCOD_ROLLOUT_FUNCTION_PATH}: the default "
                         "rollout function does not give episodes their curriculum depth")
    eta, k_start = flag("tcod_eta"), flag("tcod_k_start", 1)
    if eta is None or not eta >= 1:
        raise ValueError("--use-tcod needs --tcod-eta >= 1 (rollout steps per depth increment; official: 6 F2B, 5 B2F)")
    if not k_start >= 1:
        raise ValueError("--tcod-k-start must be >= 1")
    if flag("tcod_k_max") is None:
        args.tcod_k_max = args.max_turns
    if args.tcod_k_max < k_start:
        raise ValueError(f"--tcod-k-max ({args.tcod_k_max}) must be >= --tcod-k-start ({k_start})")
    if args.tcod_k_max > args.max_turns:
        raise ValueError(f"--tcod-k-max ({args.tcod_k_max}) must be <= --max-turns ({args.max_turns})")
    mode = flag("tcod_mode", "f2b")
    if mode == "f2b" and flag("tcod_prefix_source") is not None:
        raise ValueError("--tcod-prefix-source applies to --tcod-mode b2f only; f2b always plays from reset")
    if mode == "b2f":
        if flag("tcod_prefix_source") is None:
            args.tcod_prefix_source = "expert"
        if args.tcod_prefix_source == "teacher" and (flag("opd_type") != "sglang" or not flag("rm_url")):
            # An in-trainer teacher (--opd-type megatron) only scores: it lives in the trainer, which
            # does not generate, and the rollout side has no way to ask it for an episode.
            raise ValueError("--tcod-prefix-source teacher needs a teacher server that can generate: "
                             "--opd-type sglang with --rm-url (an in-trainer teacher, --opd-type megatron, "
                             "only scores and cannot play the prefix episodes)")
