"""The ``--tcod-*`` flags of TCOD's temporal curriculum and their validation.

``tools/slime_pr/port.py`` splices these two functions into upstream slime's ``slime/utils/arguments.py``
(registered after the on-policy-distillation group; validated at the end of ``slime_validate_args``,
after the ``--custom-config-path`` YAML has set ``max_turns``). This runtime's parser calls the same two.
"""


def add_tcod_arguments(parser):
    """Add TCOD (temporal curriculum on-policy distillation) arguments."""
    parser.add_argument(
        "--use-tcod",
        action="store_true",
        default=False,
        help=(
            "Enable TCOD's temporal curriculum for multi-turn OPD: the trajectory depth the student plays grows "
            "as k(n) = min(tcod_k_start + n // tcod_eta, tcod_k_max). "
            "Needs --rollout-function-path slime.rollout.tcod.generate_rollout."
        ),
    )
    parser.add_argument(
        "--tcod-mode",
        type=str,
        choices=["f2b", "b2f"],
        default=None,
        help=(
            "f2b: the student plays turns 1..k(n) from reset. "
            "b2f: max(0, L - k(n)) prefix turns are replayed first, then the student plays to the end. Default: f2b."
        ),
    )
    parser.add_argument("--tcod-k-start", type=int, default=None, help="Depth at step 0. Default: 1.")
    parser.add_argument("--tcod-eta", type=int, default=None, help="Rollout steps per depth increment (required).")
    parser.add_argument("--tcod-k-max", type=int, default=None, help="Largest depth. Default: max_turns.")
    return parser


TCOD_ROLLOUT_FUNCTION_PATH = "slime.rollout.tcod.generate_rollout"


def validate_tcod_args(args):
    """Check the TCOD flags and fill their defaults; nothing happens unless a ``--tcod-*`` flag is used."""
    tcod_only = ["tcod_mode", "tcod_k_start", "tcod_eta", "tcod_k_max"]
    if not getattr(args, "use_tcod", False):
        used = [f"--{name.replace('_', '-')}" for name in tcod_only if getattr(args, name, None) is not None]
        if used:
            raise ValueError(f"{', '.join(used)} set but --use-tcod is not: add --use-tcod or drop them.")
        return

    if not args.use_opd:
        raise ValueError("--use-tcod shapes on-policy distillation: add --use-opd and --opd-type.")
    max_turns = getattr(args, "max_turns", None)
    if not max_turns:
        raise ValueError(
            "--use-tcod needs a multi-turn rollout: set max_turns (the key of the --custom-config-path YAML, "
            "or --max-turns where the parser has it)."
        )
    if args.rollout_function_path != TCOD_ROLLOUT_FUNCTION_PATH:
        raise ValueError(
            f"--use-tcod needs --rollout-function-path {TCOD_ROLLOUT_FUNCTION_PATH}: "
            "other rollout functions do not give episodes their curriculum depth."
        )
    if args.tcod_eta is None or args.tcod_eta < 1:
        raise ValueError("--use-tcod needs --tcod-eta >= 1 (rollout steps per depth increment).")

    args.tcod_mode = args.tcod_mode or "f2b"
    args.tcod_k_start = 1 if args.tcod_k_start is None else args.tcod_k_start
    if args.tcod_k_start < 1:
        raise ValueError(f"--tcod-k-start must be >= 1, got {args.tcod_k_start}.")
    k_max_flag = "--tcod-k-max" if args.tcod_k_max is not None else "max_turns (the default --tcod-k-max)"
    args.tcod_k_max = max_turns if args.tcod_k_max is None else args.tcod_k_max
    if args.tcod_k_max < args.tcod_k_start:
        raise ValueError(f"--tcod-k-start ({args.tcod_k_start}) must be <= {k_max_flag} ({args.tcod_k_max}).")
    if args.tcod_k_max > max_turns:
        raise ValueError(f"--tcod-k-max ({args.tcod_k_max}) must be <= max_turns ({max_turns}).")
