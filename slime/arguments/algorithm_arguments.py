"""The algorithm side of the command line: loss and estimator, optimizer, on-policy distillation and the
reward-side KL controller, with their validation.

Split from ``slime/utils/arguments.py``, which adds these groups to the parser (in slime's order) and calls
:func:`validate_opd_args` and :func:`validate_kl_args` from ``validate_args``; every name here is importable from
``slime.utils.arguments`` too.
"""

from __future__ import annotations

import os
import warnings

from slime.arguments.argument_error import fail as _fail

ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")


def add_algorithm_arguments(parser):
    g = parser.add_argument_group("algorithm")
    g.add_argument("--loss-type", choices=("policy_loss", "sft_loss"), default="policy_loss",
                   help="policy_loss: the RL surrogate on the advantages; sft_loss: negative log-likelihood of "
                        "the trainable tokens (engines start only for evaluation)")
    g.add_argument("--advantage-estimator", choices=ESTIMATORS, default="grpo",
                   help="how rewards become advantages; ppo also trains a critic (--train-backend fsdp only)")
    g.add_argument("--eps-clip", type=float, default=0.2,
                   help="PPO clip: the ratio is clipped below at 1 - eps-clip")
    g.add_argument("--eps-clip-high", type=float, default=None,
                   help="PPO clip above: 1 + eps-clip-high (default: --eps-clip)")
    g.add_argument("--eps-clip-c", type=float, default=None, help="dual-clip constant (> 1), off by default")
    g.add_argument("--value-clip", type=float, default=0.2,
                   help="ppo: the critic's new values are clipped to old +- value-clip in its loss")
    g.add_argument("--kl-coef", type=float, default=0.0, help="reward-side KL coefficient")
    g.add_argument("--use-kl-loss", action="store_true",
                   help="add --kl-loss-coef x KL(policy || reference) to the loss (loads the reference model)")
    g.add_argument("--kl-loss-coef", type=float, default=0.0, help="weight of the --use-kl-loss term")
    g.add_argument("--kl-loss-type", choices=("k1", "k2", "k3", "low_var_kl"), default="k1",
                   help="per-token KL estimator, for the KL loss and the reward-side KL alike")
    g.add_argument("--entropy-coef", type=float, default=0.0,
                   help="entropy bonus: loss -= entropy-coef x the trained tokens' mean entropy")
    g.add_argument("--gamma", type=float, default=1.0, help="discount of reinforce_plus_plus and ppo returns")
    g.add_argument("--lambd", type=float, default=1.0, help="ppo: GAE lambda")
    g.add_argument("--normalize-advantages", action="store_true",
                   help="whiten the advantages over the batch's trained tokens (mean 0, std 1)")
    g.add_argument("--disable-grpo-std-normalization", action="store_true",
                   help="grpo / gspo: only subtract the group mean, do not divide by the group std")
    g.add_argument("--use-rollout-logprobs", action="store_true",
                   help="use the engine's sampling log-probs as the old policy instead of recomputing")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="average losses over all trained tokens of the step (off: each sample's token mean, "
                        "averaged over samples)")
    return parser


def add_optimizer_arguments(parser):
    g = parser.add_argument_group("optimizer")
    g.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate of the policy (constant)")
    g.add_argument("--critic-lr", type=float, default=None, help="ppo: the critic's learning rate (default: --lr)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay")
    g.add_argument("--adam-beta1", type=float, default=0.9, help="AdamW beta1")
    g.add_argument("--adam-beta2", type=float, default=0.999, help="AdamW beta2")
    g.add_argument("--adam-eps", type=float, default=1e-8, help="AdamW epsilon")
    g.add_argument("--clip-grad", type=float, default=1.0,
                   help="clip the global gradient norm to this (<= 0: no clipping)")
    return parser


def add_on_policy_distillation_arguments(parser):
    g = parser.add_argument_group("on-policy distillation")
    g.add_argument("--use-opd", action="store_true", help="add the teacher reverse-KL term to the advantages")
    g.add_argument("--opd-type", choices=("sglang", "megatron"), default=None,
                   help="sglang: teacher on a server via --rm-url; megatron: teacher loaded in the trainer")
    g.add_argument("--opd-kl-coef", type=float, default=1.0,
                   help="weight of the OPD term: advantages -= coef x (student - teacher log-prob), or with "
                        "--opd-loss full loss += coef x the full reverse KL")
    g.add_argument("--opd-teacher-load", type=str, default=None,
                   help="in-trainer teacher checkpoint: a HF folder, or with --train-backend megatron also a "
                        "Megatron checkpoint root")
    g.add_argument("--opd-teacher-ckpt-step", type=int, default=None,
                   help="iteration of a Megatron --opd-teacher-load root (default: the latest)")
    # This runtime's additions (upstream slime has only the sampled term).
    g.add_argument("--opd-loss", choices=("sampled", "full"), default="sampled",
                   help="sampled: slime's per-token term student - teacher in the advantages (default); full: "
                        "the whole-vocabulary reverse KL at every trained position as a loss term (in-trainer "
                        "teacher), or its top-k form (server teacher, see --opd-teacher-top-k)")
    g.add_argument("--opd-teacher-top-k", type=int, default=None,
                   help="server teacher: ask for its top-K log-probs per position (SGLang top_logprobs_num) "
                        "for the opd/topk_kl diagnostic and --opd-loss full (default 20 with --opd-loss full, "
                        "else 0 = not asked)")
    return parser


def add_kl_controller_arguments(parser):
    # The flags of the slime PR's --kl-ctrl (docs/en/advanced/adaptive-kl-controller.md): same names, defaults
    # and refusals; the controller is its slime/utils/kl_controller.py.
    g = parser.add_argument_group("reward-side KL controller")
    g.add_argument("--kl-ctrl", choices=("fixed", "adaptive"), default="fixed",
                   help="fixed: --kl-coef stays; adaptive: it is moved toward --kl-target after every step "
                        "(Ziegler et al.; --advantage-estimator ppo only)")
    g.add_argument("--kl-target", type=float, default=None,
                   help="adaptive: the KL to the reference to hold, per token: each sample's mean over its "
                        "trained tokens, averaged over the step's samples (required)")
    g.add_argument("--kl-horizon", type=float, default=None,
                   help="adaptive (default 10000): after each step coef *= 1 + clip(observed / target - 1, "
                        "-0.2, 0.2) x the step's samples / horizon; at least a step's samples")
    # This runtime's one addition: the per-response unit of Ziegler et al.'s code and TRL, for their targets.
    g.add_argument("--kl-ctrl-unit", choices=("token", "sequence"), default="token",
                   help="adaptive: the KL fed to the controller: token (the PR's, verl's) or each sample's sum "
                        "over its tokens, averaged over samples (Ziegler et al.'s code, TRL)")
    return parser


# ---------------------------------------------------------------------------- validation
def validate_opd_args(args):
    if args.opd_teacher_load is not None and not args.use_opd:
        _fail("--opd-teacher-load is set but --use-opd is not: add --use-opd or drop --opd-teacher-load")
    if not args.use_opd:
        if args.opd_loss != "sampled" or args.opd_teacher_top_k:
            _fail("--opd-loss / --opd-teacher-top-k need --use-opd")
        args.opd_teacher_top_k = 0
        return
    if args.opd_type is None:
        _fail("--use-opd needs --opd-type: 'sglang' (teacher server at --rm-url) or 'megatron' (in-trainer teacher)")
    if args.opd_type == "megatron":
        if args.opd_teacher_load is None:
            _fail("--opd-type megatron needs --opd-teacher-load (the teacher checkpoint folder)")
        if not os.path.exists(args.opd_teacher_load):
            _fail(f"--opd-teacher-load {args.opd_teacher_load!r} does not exist")
    if args.opd_type == "sglang":
        if args.opd_teacher_load is not None:
            _fail("--opd-type sglang takes the teacher from the server at --rm-url; drop --opd-teacher-load "
                  "(or use --opd-type megatron to load it into the trainer)")
        if args.rollout_temperature != 1.0:
            warnings.warn(
                f"--rollout-temperature {args.rollout_temperature} with --opd-type sglang: the teacher server "
                "scores at temperature 1, so the OPD term compares distributions at different temperatures",
                stacklevel=3,
            )
    if args.opd_kl_coef < 0:
        _fail("--opd-kl-coef must be >= 0")
    _validate_opd_loss(args)


def _validate_opd_loss(args):
    if args.opd_teacher_top_k is not None and args.opd_teacher_top_k < 0:
        _fail(f"--opd-teacher-top-k must be >= 0, got {args.opd_teacher_top_k}")
    if args.opd_type == "megatron" and args.opd_teacher_top_k:
        _fail("--opd-teacher-top-k is for a server teacher (--opd-type sglang); the in-trainer teacher gives "
              "whole distributions")
    if args.opd_teacher_top_k is None:
        args.opd_teacher_top_k = 20 if args.opd_loss == "full" and args.opd_type == "sglang" else 0
    if args.opd_loss == "full" and args.opd_type == "sglang" and args.opd_teacher_top_k == 0:
        _fail("--opd-loss full with a server teacher needs its top-k log-probs: --opd-teacher-top-k K > 0")
    if args.opd_loss == "sampled" and args.num_steps_per_rollout > 1:
        # docs/en/advanced/opd-regimes.md: slime's sampled term is carried by a few heavy-tailed tokens, so a
        # small optimizer batch's gradient is mostly noise and Adam takes full-size steps along it.
        warnings.warn(
            f"--use-opd with {args.num_steps_per_rollout} optimizer steps per rollout (--global-batch-size "
            f"{args.global_batch_size}): the sampled OPD term was measured to stall or raise the KL to the "
            "teacher in this regime (docs/en/advanced/opd-regimes.md). Use one optimizer step per rollout "
            "(--global-batch-size = --rollout-batch-size x --n-samples-per-prompt, the default) or --opd-loss full",
            stacklevel=3,
        )


def validate_kl_args(args):
    if args.kl_coef < 0 or args.kl_loss_coef < 0:
        _fail("--kl-coef and --kl-loss-coef must be >= 0")
    if args.kl_coef != 0 and args.kl_loss_coef != 0:
        _fail("--kl-coef (reward-side KL) and --kl-loss-coef (KL loss term) are both non-zero, which counts "
              "the KL to the reference twice: keep one of them")
    if args.kl_ctrl != "adaptive":
        if args.kl_target is not None or args.kl_horizon is not None:
            _fail("--kl-target and --kl-horizon are only used with --kl-ctrl adaptive: add it or drop them")
        return
    if args.advantage_estimator != "ppo":
        _fail(f"--kl-ctrl adaptive adapts the reward-side --kl-coef of --advantage-estimator ppo, not "
              f"{args.advantage_estimator}; keep --kl-ctrl fixed and regularise with --use-kl-loss --kl-loss-coef")
    if args.kl_horizon is None:
        args.kl_horizon = 10000.0
    # Every missing or non-positive one in the same line: a PPO command line often lacks two of them.
    missing = [f"{flag} > 0 ({'not given' if value is None else f'got {value:g}'})"
               for flag, value in (("--kl-coef", args.kl_coef), ("--kl-target", args.kl_target),
                                   ("--kl-horizon", args.kl_horizon))
               if value is None or value <= 0]  # validate_finite has refused nan and inf already
    if missing:
        named = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
        _fail(f"--kl-ctrl adaptive needs {named}: set {'them' if len(missing) > 1 else 'it'} "
              "(docs/en/advanced/adaptive-kl-controller.md says how to choose)")
    step_samples = args.rollout_batch_size * args.n_samples_per_prompt
    if args.kl_horizon < step_samples:
        _fail(f"--kl-horizon ({args.kl_horizon:g}) must be >= the samples of a step (--rollout-batch-size x "
              f"--n-samples-per-prompt = {step_samples})")
