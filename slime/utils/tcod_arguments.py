"""The ``--tcod-*`` flags of TCOD's temporal curriculum and their validation: the text the PR adds to slime.

``tools/slime_pr/port.py`` splices both into slime's ``slime/utils/arguments.py``: ``add_tcod_arguments``
is re-indented into ``get_slime_extra_args_provider`` beside slime's nested groups (registered after the
on-policy-distillation group), and the body of ``validate_tcod_args`` is inlined into ``slime_validate_args``
after the ``--custom-config-path`` YAML is applied (it may set the flags). So both are written in slime's style;
this runtime's parser calls the same two.
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
            "Requires --use-opd, --tcod-eta and such a --custom-generate-function-path."
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
            "then the student plays on; replayed and student turns together are at most max_turns. "
            "Default is f2b."
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
        help=(
            "Largest TCOD curriculum depth; B2F then replays at least L - k_max expert turns. "
            "Default is the generate function's max_turns."
        ),
    )
    return parser


def validate_tcod_args(args):
    """Check the ``--tcod-*`` flags and fill their defaults; port.py inlines this body into slime_validate_args."""
    # Validate TCOD arguments. getattr: args built by hand (tests, tools) may lack the TCOD flags.
    if getattr(args, "use_tcod", False):
        if not args.use_opd:
            raise ValueError("--use-tcod requires --use-opd: TCOD is a curriculum for on-policy distillation.")
        if args.custom_generate_function_path is None:
            raise ValueError(
                "--use-tcod requires a multi-turn --custom-generate-function-path that plays the curriculum "
                "(e.g. examples.multi_turn_tcod.rollout.generate); the default generate plays a single turn."
            )
        if args.tcod_eta is None or args.tcod_eta < 1:
            raise ValueError("--tcod-eta must be specified and >= 1 when --use-tcod is enabled.")
        if args.tcod_mode is None:
            args.tcod_mode = "f2b"
        if args.tcod_k_start is None:
            args.tcod_k_start = 1
        # --tcod-k-max unset: the generate function's turn limit (slime.rollout.tcod.episode_plan).
        if args.tcod_k_start < 1 or (args.tcod_k_max is not None and args.tcod_k_max < args.tcod_k_start):
            raise ValueError(
                f"TCOD requires 1 <= --tcod-k-start ({args.tcod_k_start}) <= --tcod-k-max ({args.tcod_k_max})."
            )
        # A generate function that never asks for its episode plan would train without the curriculum: this
        # hook fails the first rollout step then. A new list, so that the parser's default stays empty.
        hook = "slime.rollout.tcod.check_episode_planned"
        hooks = getattr(args, "rollout_sample_hook_path", None) or []
        if hook not in hooks:
            args.rollout_sample_hook_path = [*hooks, hook]
    else:
        for name in ("tcod_mode", "tcod_k_start", "tcod_eta", "tcod_k_max"):
            if getattr(args, name, None) is not None:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} is set but --use-tcod is not enabled. Please add --use-tcod flag.")
