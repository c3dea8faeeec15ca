"""The ``--tcod-*`` flags of TCOD's temporal curriculum and their validation: the text the PR adds to slime.

``tools/slime_pr/port.py`` splices both into slime's ``slime/utils/arguments.py``: ``add_tcod_arguments``
is re-indented into ``get_slime_extra_args_provider`` beside slime's nested groups (registered after the
on-policy-distillation group), and the body of ``validate_tcod_args`` is inlined into ``slime_validate_args``
after the ``--custom-config-path`` YAML is applied (multi-turn examples set ``max_turns`` there). So both
are written in slime's style; this runtime's parser calls the same two.
"""


def add_tcod_arguments(parser):
    """Add TCOD (temporal curriculum on-policy distillation) arguments.

    At rollout n the student plays k(n) = min(tcod_k_start + n // tcod_eta, tcod_k_max) turns of each
    trajectory: the first k(n) turns (f2b), or the last k(n) after the expert's first turns (b2f).
    """
    parser.add_argument(
        "--use-tcod",
        action="store_true",
        default=False,
        help=(
            "Enable TCOD's temporal curriculum for multi-turn on-policy distillation, played by a generate "
            "function that reads it (examples/multi_turn_tcod). "
            "Requires --use-opd, --tcod-eta and max_turns (set by the --custom-config-path YAML)."
        ),
    )
    parser.add_argument(
        "--tcod-mode",
        type=str,
        choices=["f2b", "b2f"],
        default=None,
        help=(
            "'f2b': the student plays turns 1..k(n) from reset. "
            "'b2f': max(0, L - k(n)) expert turns are replayed first (L: the task's expert actions), "
            "then the student plays to the end. Default is f2b."
        ),
    )
    parser.add_argument(
        "--tcod-k-start",
        type=int,
        default=None,
        help="TCOD curriculum depth at rollout 0. Default is 1.",
    )
    parser.add_argument(
        "--tcod-eta",
        type=int,
        default=None,
        help="Rollouts per TCOD depth increment. Required when --use-tcod is enabled.",
    )
    parser.add_argument(
        "--tcod-k-max",
        type=int,
        default=None,
        help="Largest TCOD curriculum depth. Default is max_turns.",
    )
    return parser


def validate_tcod_args(args):
    """Check the ``--tcod-*`` flags and fill their defaults; port.py inlines this body into slime_validate_args."""
    # Validate TCOD arguments. getattr: args built by hand (tests, tools) may lack the TCOD flags.
    if getattr(args, "use_tcod", False):
        if not args.use_opd:
            raise ValueError("--use-tcod requires --use-opd: TCOD is a curriculum for on-policy distillation.")
        max_turns = getattr(args, "max_turns", None)
        if not max_turns:
            raise ValueError("--use-tcod requires max_turns (a multi-turn rollout); set it in --custom-config-path.")
        if args.tcod_eta is None or args.tcod_eta < 1:
            raise ValueError("--tcod-eta must be specified and >= 1 when --use-tcod is enabled.")
        if args.tcod_mode is None:
            args.tcod_mode = "f2b"
        if args.tcod_k_start is None:
            args.tcod_k_start = 1
        if args.tcod_k_max is None:
            args.tcod_k_max = max_turns
        if not 1 <= args.tcod_k_start <= args.tcod_k_max <= max_turns:
            raise ValueError(
                f"TCOD requires 1 <= --tcod-k-start ({args.tcod_k_start}) <= --tcod-k-max ({args.tcod_k_max}) "
                f"<= max_turns ({max_turns})."
            )
    else:
        for name in ("tcod_mode", "tcod_k_start", "tcod_eta", "tcod_k_max"):
            if getattr(args, name, None) is not None:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} is set but --use-tcod is not enabled. Please add --use-tcod flag.")
