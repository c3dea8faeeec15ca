"""The adaptive-KL pull request (THUDM/slime #2387): which files of this repository it carries and how it edits
upstream's.

Its files land at the same paths upstream: ``slime/utils/kl_controller.py`` (shared with the runtime's trainer), its
tests and docs; its ``tests/test_kl_controller.py`` lives here as ``tests/test_kl_controller_pr.py`` (``SOURCES``:
the runtime's own test holds that name). ``EDITS`` are its edits of upstream's files, (file, anchor, replacement): the
anchor must be there exactly ``_COUNTS`` times (once by default); a file that holds an edit already is left alone
(``_DONE_MARK``), so a second run changes nothing. The anchors are not the TCOD PR's: it applies after that PR too.
"""

from __future__ import annotations

from pathlib import Path

# Shared with the TCOD PR; port.py reads VERIFIED_COMMIT here too.
from tools.slime_pr.manifest import RENDERED, TEMPLATE, VERIFIED_COMMIT, PortError  # noqa: F401

AUTHOR = "slime-pr"  # of the commit port.py makes in a git work tree
CORE_FILES = ("slime/utils/kl_controller.py",)
CPU_TEST_FILES = (
    "tests/test_kl_controller.py",
    "tests/test_kl_controller_cp.py",
    "tests/test_kl_controller_actor.py",
)
GPU_TEST_FILE = "tests/test_qwen3_4B_ppo_adaptive_kl.py"
GPU_TEST_GPUS = 8
GPU_REGISTRATION = (("", GPU_TEST_GPUS),)  # (test_args, GPUs) of its one GPU entry
TEST_FILES = (*CPU_TEST_FILES, GPU_TEST_FILE)
DOC_FILES = ("docs/en/advanced/adaptive-kl-controller.md", "docs/zh/advanced/adaptive-kl-controller.md")
COPIED_FILES = CORE_FILES + TEST_FILES + DOC_FILES
SOURCES = {"tests/test_kl_controller.py": "tests/test_kl_controller_pr.py"}  # upstream path -> path here
SPLICED: tuple[str, ...] = ()  # every file of this repository the PR carries is copied
# verify_pr.py's caps: added lines under slime/ and in all, the CI template and its rendering not counted.
CAPS = {"core": 300, "added": 1500}
UNCOUNTED = (TEMPLATE, RENDERED)

ARGS = "slime/utils/arguments.py"
LOSS = "slime/backends/megatron_utils/loss.py"
ACTOR = "slime/backends/megatron_utils/actor.py"
FIXTURE = "tests/test_megatron_argument_validation.py"
SERVER = "slime/backends/megatron_utils/server/arguments.py"
CI_UTILS = "slime/backends/megatron_utils/ci_utils.py"
WANDB = "slime/observability/wandb_utils.py"
EXPECTED = (  # checked before anything else: (file, text that must be there, why)
    (ARGS, "def slime_validate_args(args):", "where the --kl-* flags are validated"),
    (LOSS, "def compute_advantages_and_returns(", "the advantages the coefficient shapes"),
)

_KL_COEF_FLAG = """\
                help="KL penalty coefficient for reward shaping. This is applied to the reward signal before advantage calculation.",
            )
"""
_KL_CTRL_FLAGS = """\
            parser.add_argument(
                "--kl-ctrl",
                type=str,
                choices=["fixed", "adaptive"],
                default="fixed",
                help=(
                    "How --kl-coef evolves during training. 'fixed' keeps it constant. 'adaptive' (PPO only) starts "
                    "from --kl-coef and moves it after every rollout toward --kl-target (Ziegler et al., 2019)."
                ),
            )
            parser.add_argument(
                "--kl-target",
                type=float,
                default=None,
                help=(
                    "Target of --kl-ctrl adaptive: the KL to the reference model (estimator --kl-loss-type) in "
                    "verl's per-sample unit: each sample's mean over its response tokens (loss mask applied), "
                    "averaged over the samples of a step. Not rollout/kl, a token mean; compare kl_ctrl/observed_kl. "
                    "A per-response target (TRL, Ziegler et al.: 6) is divided by the response length here."
                ),
            )
            parser.add_argument(
                "--kl-horizon",
                type=float,
                default=None,
                help=(
                    "Horizon of --kl-ctrl adaptive, in samples (default 10000, as in Ziegler et al.'s code, TRL and "
                    "verl): after each rollout the coefficient is multiplied by 1 + clip(observed / target - 1, -0.2, "
                    "0.2) * samples of the step / horizon. slime warns when one set is under 10x a step's samples."
                ),
            )
"""

_VALIDATE_ANCHOR = '    assert not (args.kl_coef != 0 and args.kl_loss_coef != 0), "Only one of kl_coef and kl_loss_coef can be set"\n'
_VALIDATE = """\
    if args.kl_ctrl == "adaptive":
        if args.advantage_estimator != "ppo":
            raise ValueError(
                f"--kl-ctrl adaptive adapts the reward-side --kl-coef of --advantage-estimator ppo, not "
                f"{args.advantage_estimator}; with other estimators regularize with --use-kl-loss --kl-loss-coef."
            )
        default_horizon = args.kl_horizon is None
        if default_horizon:
            args.kl_horizon = 10000.0
        settings = {"--kl-coef": args.kl_coef, "--kl-target": args.kl_target, "--kl-horizon": args.kl_horizon}
        for flag, value in settings.items():
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(f"--kl-ctrl adaptive needs a finite {flag} > 0, got {value}.")
        if args.custom_advantage_function_path is not None:
            raise ValueError("--kl-ctrl adaptive cannot hand its coefficient to --custom-advantage-function-path.")
        if not args.compute_advantages_and_returns:
            raise ValueError("--kl-ctrl adaptive needs the KL that --disable-compute-advantages-and-returns skips.")
        if args.rollout_batch_size * args.n_samples_per_prompt > args.kl_horizon:
            raise ValueError(
                f"--kl-horizon ({args.kl_horizon:g}{', the default' if default_horizon else ''}) must be >= the "
                f"samples of a step (rollout_batch_size * n_samples_per_prompt = "
                f"{args.rollout_batch_size * args.n_samples_per_prompt})."
            )
        if not default_horizon and args.kl_horizon < 10 * args.rollout_batch_size * args.n_samples_per_prompt:
            logger.warning(
                f"--kl-horizon {args.kl_horizon:g} is under 10x the samples of a step: the coefficient moves up to "
                f"{0.2 * args.rollout_batch_size * args.n_samples_per_prompt / args.kl_horizon:.0%} a step."
            )
    elif args.kl_target is not None or args.kl_horizon is not None:
        raise ValueError("--kl-target and --kl-horizon are only used with --kl-ctrl adaptive.")

"""

_LOSS_SIGNATURE = "def compute_advantages_and_returns(args: Namespace, rollout_data: RolloutBatch) -> None:\n"
_LOSS_SIGNATURE_NEW = (
    "def compute_advantages_and_returns(args: Namespace, rollout_data: RolloutBatch, kl_coef: float | None = None) -> None:\n"
)
_LOSS_DOC = '''            "returns" keys, each mapping to lists of tensors per sample.
    """
'''
_LOSS_DOC_NEW = '''            "returns" keys, each mapping to lists of tensors per sample.
        kl_coef: The reward-side KL coefficient to use instead of ``args.kl_coef``
            (``--kl-ctrl adaptive``); ``None`` uses ``args.kl_coef``.
    """
'''
_LOSS_EARLY_RETURN = """\
    if not mpu.is_pipeline_last_stage():
        return

    if args.kl_coef == 0 or not log_probs:
"""
_LOSS_EARLY_RETURN_NEW = """\
    if not mpu.is_pipeline_last_stage():
        return
    if kl_coef is None:
        kl_coef = args.kl_coef

    if kl_coef == 0 or not log_probs:
"""
_LOSS_PPO = """\
        kl_coef = -args.kl_coef
        cp_rank = mpu.get_context_parallel_rank()
        for reward, per_token_kl in zip(old_rewards, kl, strict=False):
            token_level_rewards = per_token_kl * kl_coef
"""
_LOSS_PPO_NEW = """\
        cp_rank = mpu.get_context_parallel_rank()
        for reward, per_token_kl in zip(old_rewards, kl, strict=False):
            token_level_rewards = per_token_kl * -kl_coef
"""
_LOSS_RPP = """\
            kl_coef=args.kl_coef,
"""
_LOSS_RPP_NEW = """\
            kl_coef=kl_coef,
"""
_LOSS_REDUCE_ANCHOR = _LOSS_SIGNATURE_NEW
_LOSS_REDUCE = '''def reduce_observed_kl(rollout_data: RolloutBatch, group) -> tuple[float | None, int]:
    """The step's KL for ``--kl-ctrl adaptive``, the same number on every rank of ``group``.

    Each sample's masked mean of ``rollout_data["kl"]``, averaged over the samples of every data-parallel rank
    that keep a loss mask (a removed sample, all-zero mask, has no KL and is not counted).
    Context-parallel ranks each add their share of a sample's mean and only CP rank 0 counts the sample;
    ranks without KL (not the last pipeline stage, tensor-parallel rank > 0) add nothing. One float64
    all-reduce of (sum, count) over ``group``, which every rank must call. Returns (mean, count), or
    (None, 0) when no rank holds a sample.
    """
    totals = torch.zeros(2, dtype=torch.float64)
    kl = rollout_data.get("kl")
    if kl is not None and mpu.is_pipeline_last_stage() and mpu.get_tensor_model_parallel_rank() == 0:
        if kl:
            sum_of_sample_mean = get_sum_of_sample_mean(
                rollout_data["total_lengths"], rollout_data["response_lengths"], rollout_data["loss_masks"]
            )
            totals[0] = float(sum_of_sample_mean(torch.cat(kl)))
        if mpu.get_context_parallel_rank() == 0:
            totals[1] = sum(1 for mask in rollout_data["loss_masks"] if mask.sum() > 0)
    dist.all_reduce(totals, group=group)
    count = int(totals[1].item())
    return (totals[0].item() / count if count else None), count


'''

_ARGS_IMPORT = "import logging\nimport os\n"
_ARGS_IMPORT_NEW = "import logging\nimport math\nimport os\n"

_CRITIC_OVERRIDE = "        role_args.kl_coef = 0\n"
_CRITIC_OVERRIDE_NEW = '        role_args.kl_coef = 0\n        role_args.kl_ctrl = "fixed"\n'
_SERVER = "    args.kl_coef = 0\n"
_SERVER_NEW = '    args.kl_coef = 0\n    args.kl_ctrl = "fixed"\n'

_ACTOR_IMPORT = "from slime.utils.distributed_utils import get_gloo_group\n"
_ACTOR_IMPORT_NEW = (
    "from slime.utils.distributed_utils import get_gloo_group\n"
    "from slime.utils.kl_controller import (\n"
    "    build_kl_controller,\n"
    "    restore_kl_controller,\n"
    "    save_kl_controller,\n"
    "    step_kl_controller,\n"
    ")\n"
)
_ACTOR_LOSS_IMPORT = "    get_values,\n)\n"
_ACTOR_LOSS_IMPORT_NEW = "    get_values,\n    reduce_observed_kl,\n)\n"
_ACTOR_INIT = """\
        start_rollout_id = loaded_rollout_id + 1

        if role == "critic":
"""
_ACTOR_INIT_NEW = """\
        start_rollout_id = loaded_rollout_id + 1

        # Only the actor adapts. Without --megatron-config-path the critic's args are a copy of the actor's
        # (kl_ctrl adaptive); the critic builds no controller and calls compute_advantages_and_returns as before.
        self.kl_ctrl = build_kl_controller(args) if role == "actor" and args.kl_ctrl == "adaptive" else None
        if self.kl_ctrl is not None:
            state = restore_kl_controller(self.kl_ctrl, args, loaded_rollout_id, get_gloo_group())
            if args.ci_test and args.load is not None and not args.finetune:
                assert state is not None, f"no KL controller state for the loaded rollout {loaded_rollout_id}"
                assert self.kl_ctrl.value == state["value"], f"restored {self.kl_ctrl.value}, saved {state}"

        if role == "critic":
"""
_ACTOR_CALL = "                compute_advantages_and_returns(self.args, rollout_data)\n\n            if self.rollout_data_postprocess"
_ACTOR_CALL_NEW = """\
                kl_coef = None if self.kl_ctrl is None else self.kl_ctrl.value
                compute_advantages_and_returns(self.args, rollout_data, kl_coef=kl_coef)
                if self.args.ci_test and self.kl_ctrl is not None and mpu.is_pipeline_last_stage():
                    from .ci_utils import check_reward_kl_coef

                    check_reward_kl_coef(self.args, rollout_data, self.kl_ctrl.value, rollout_id)

            if self.rollout_data_postprocess"""
_ACTOR_LOG = """\
        train_metric_utils.log_perf_data(
            rollout_id,
            self.args,
            extra_metrics=self.weight_updater.pop_metrics(),
        )
"""
_ACTOR_LOG_NEW = """\
        extra_metrics = self.weight_updater.pop_metrics()
        if self.kl_ctrl is not None:  # on every rank, so the coefficient stays the same everywhere
            observed_kl, n_samples = reduce_observed_kl(rollout_data, get_gloo_group())
            check = get_gloo_group() if self.args.ci_test else None
            kl_metrics = step_kl_controller(self.kl_ctrl, observed_kl, n_samples, check)
            extra_metrics = {**(extra_metrics or {}), **kl_metrics}
        train_metric_utils.log_perf_data(
            rollout_id,
            self.args,
            extra_metrics=extra_metrics,
        )
"""
_ACTOR_SAVE = "        save(rollout_id, self.model, self.optimizer, self.opt_param_scheduler)\n"
_ACTOR_SAVE_NEW = (
    "        save(rollout_id, self.model, self.optimizer, self.opt_param_scheduler)\n"
    "        if self.kl_ctrl is not None and dist.get_rank() == 0:\n"
    "            save_kl_controller(self.kl_ctrl, self.args.save, rollout_id)\n"
)

_CI_IMPORT = "import logging\nfrom collections.abc import Sequence\n\n"
_CI_IMPORT_NEW = "import logging\nimport math\nfrom collections.abc import Sequence\n\nimport torch\n"
_CI_END = """\
        "This may indicate an issue with MTP training."
    )
"""
_CI_CHECK = '''

def check_reward_kl_coef(args, rollout_data, kl_coef: float, rollout_id: int) -> None:
    """Check that PPO's rewards were shaped with ``kl_coef``: with ``--gamma 1 --lambd 1`` a return grows from one
    response token to the next (the last one holds the reward) by ``kl_coef * kl``, so the least-squares slope of
    that growth against the per-token KL, over this rank's samples, must be ``kl_coef``. Logs the slope and its
    tolerance. No KL to fit fails, except at rollout 0, where the actor may still equal its reference."""
    assert args.gamma == 1 and args.lambd == 1, "check_reward_kl_coef needs --gamma 1 --lambd 1"
    from .cp_utils import all_gather_with_cp

    growth, kl = [], []
    with torch.no_grad():
        for returns, sample_kl, total_length, response_length in zip(
            rollout_data["returns"],
            rollout_data["kl"],
            rollout_data["total_lengths"],
            rollout_data["response_lengths"],
            strict=True,
        ):
            returns = all_gather_with_cp(returns, total_length, response_length).double()
            growth.append(returns[1:] - returns[:-1])
            kl.append(all_gather_with_cp(sample_kl, total_length, response_length).double()[:-1])
    growth, kl = torch.cat(growth), torch.cat(kl)
    kl_square_sum = (kl * kl).sum().item()
    if kl_square_sum == 0:  # the actor still equals its reference: allowed at rollout 0 only
        assert rollout_id == 0, f"rollout {rollout_id}: no KL to fit, the KL coefficient check proves nothing"
        return logger.info("check_reward_kl_coef: rollout 0, KL 0 (actor = reference): nothing to fit")
    slope = (growth * kl).sum().item() / kl_square_sum
    residual = (growth - slope * kl).square().sum().item() / max(len(kl) - 1, 1)
    tolerance = 1e-3 * kl_coef + 6 * math.sqrt(residual / kl_square_sum)
    fit = f"fitted KL coefficient {slope:.6g}, controller's {kl_coef:.6g}, tolerance {tolerance:.2g}"
    logger.info(f"check_reward_kl_coef: rollout {rollout_id}: {fit}")
    assert abs(slope - kl_coef) <= tolerance, f"PPO's rewards were not shaped with the controller's value: {fit}"
'''
_WANDB = '    wandb.define_metric("perf/*", step_metric="rollout/step")\n'
_WANDB_NEW = _WANDB + '    wandb.define_metric("kl_ctrl/*", step_metric="rollout/step")\n'

_FIXTURE = "        kl_coef=0,\n"
_FIXTURE_NEW = '        kl_coef=0,\n        kl_ctrl="fixed",\n        kl_target=None,\n        kl_horizon=None,\n'

_USAGE_EN = "- `--kl-coef`: KL penalty coefficient for reward shaping.\n"
_USAGE_EN_NEW = _USAGE_EN + (
    "- `--kl-ctrl`: `fixed` (default) keeps `--kl-coef`; `adaptive` (PPO) moves it toward `--kl-target` after every "
    "rollout, see [Adaptive KL Coefficient](../advanced/adaptive-kl-controller.md).\n"
    "- `--kl-target`: the KL `--kl-ctrl adaptive` holds (each sample's masked token mean, averaged over samples).\n"
    "- `--kl-horizon`: how fast `--kl-ctrl adaptive` moves, in samples (default 10000).\n"
)
_USAGE_ZH = "- `--kl-coef`：KL penalty 系数，用于 reward shaping。\n"
_USAGE_ZH_NEW = _USAGE_ZH.replace("。", "；") + (  # the list goes on, so the kl-coef item ends as the others do
    "- `--kl-ctrl`：`fixed`（默认）保持 `--kl-coef` 不变；`adaptive`（PPO）每个 rollout 后使其向 `--kl-target` 调整，"
    "见 [PPO 的自适应 KL 系数](../advanced/adaptive-kl-controller.md)；\n"
    "- `--kl-target`：`--kl-ctrl adaptive` 保持的 KL（每个样本 token 均值（应用 loss mask）再对样本求均值）；\n"
    "- `--kl-horizon`：`--kl-ctrl adaptive` 调整的快慢，以样本数计（默认 10000）。\n"
)

_DOC_ANCHOR = "   advanced/on-policy-distillation.md\n"
_DOC_NEW = "   advanced/on-policy-distillation.md\n   advanced/adaptive-kl-controller.md\n"

_GPU_ANCHOR = "    {'test_file': 'test_qwen3_4B_ppo.py', 'num_gpus': 8, 'enable_eval': '0'},\n"
_GPU_NEW = (
    _GPU_ANCHOR
    + f"    {{'test_file': '{Path(GPU_TEST_FILE).name}', 'num_gpus': {GPU_TEST_GPUS}, 'enable_eval': '0'}},\n"
)
_CPU_ANCHOR = "        {'test_file': 'test_ppo_kl_metric.py', 'num_gpus': 0},\n"
_CPU_NEW = _CPU_ANCHOR + "".join(
    f"        {{'test_file': '{Path(rel).name}', 'num_gpus': 0}},\n" for rel in CPU_TEST_FILES
)

EDITS = (
    (ARGS, _KL_COEF_FLAG, _KL_COEF_FLAG + _KL_CTRL_FLAGS),
    (ARGS, _VALIDATE_ANCHOR, _VALIDATE + _VALIDATE_ANCHOR),
    (ARGS, _ARGS_IMPORT, _ARGS_IMPORT_NEW),
    (ARGS, _CRITIC_OVERRIDE, _CRITIC_OVERRIDE_NEW),
    (SERVER, _SERVER, _SERVER_NEW),
    (LOSS, _LOSS_SIGNATURE, _LOSS_SIGNATURE_NEW),
    (LOSS, _LOSS_DOC, _LOSS_DOC_NEW),
    (LOSS, _LOSS_EARLY_RETURN, _LOSS_EARLY_RETURN_NEW),
    (LOSS, _LOSS_PPO, _LOSS_PPO_NEW),
    (LOSS, _LOSS_RPP, _LOSS_RPP_NEW),  # reinforce_plus_plus and _baseline: both call sites
    (LOSS, _LOSS_REDUCE_ANCHOR, _LOSS_REDUCE + _LOSS_REDUCE_ANCHOR),
    (ACTOR, _ACTOR_IMPORT, _ACTOR_IMPORT_NEW),
    (ACTOR, _ACTOR_LOSS_IMPORT, _ACTOR_LOSS_IMPORT_NEW),
    (ACTOR, _ACTOR_INIT, _ACTOR_INIT_NEW),
    (ACTOR, _ACTOR_CALL, _ACTOR_CALL_NEW),
    (ACTOR, _ACTOR_LOG, _ACTOR_LOG_NEW),
    (ACTOR, _ACTOR_SAVE, _ACTOR_SAVE_NEW),
    (CI_UTILS, _CI_IMPORT, _CI_IMPORT_NEW),
    (CI_UTILS, _CI_END, _CI_END + _CI_CHECK),
    (WANDB, _WANDB, _WANDB_NEW),
    (FIXTURE, _FIXTURE, _FIXTURE_NEW),
    (TEMPLATE, _GPU_ANCHOR, _GPU_NEW),
    (TEMPLATE, _CPU_ANCHOR, _CPU_NEW),
    ("docs/en/index.rst", _DOC_ANCHOR, _DOC_NEW),
    ("docs/en/get_started/usage.md", _USAGE_EN, _USAGE_EN_NEW),
    ("docs/zh/get_started/usage.md", _USAGE_ZH, _USAGE_ZH_NEW),
    ("docs/zh/index.rst", _DOC_ANCHOR, _DOC_NEW),
)
# How many times each anchor appears in pristine upstream (all once, except the reinforce++ keyword).
_COUNTS = {_LOSS_RPP: 2}
# Marks of an applied edit, checked before anything else.
_DONE_MARK = {ARGS: '"--kl-ctrl"', CI_UTILS: "def check_reward_kl_coef(", WANDB: '"kl_ctrl/*"', LOSS: "def reduce_observed_kl(", ACTOR: "self.kl_ctrl", FIXTURE: 'kl_ctrl="fixed"'}

MESSAGE = "Adaptive reward-side KL coefficient for PPO (--kl-ctrl adaptive)"
COMMITS = ((MESSAGE, [*COPIED_FILES, *dict.fromkeys(rel for rel, _, _ in EDITS), RENDERED]),)  # one commit


def _apply(source: str, anchor: str, new: str, count: int) -> str:
    found = source.count(anchor)
    if found != count:
        raise PortError(f"anchor {anchor.strip().splitlines()[0][:80]!r} found {found} times, expected {count}")
    return source.replace(anchor, new)


def edits(slime_dir: Path) -> dict[str, str]:
    """The new text of every upstream file the PR edits (port.py keeps those that differ)."""
    texts: dict[str, str] = {}
    for rel, anchor, replacement in EDITS:
        path = slime_dir / rel
        if not path.is_file():
            raise PortError(f"{rel} is missing: {slime_dir} is not an upstream slime tree")
        text = texts.setdefault(rel, path.read_text())
        mark = _DONE_MARK.get(rel)
        if (mark is not None and mark in path.read_text()) or (mark is None and replacement in text):
            continue  # applied already
        texts[rel] = _apply(text, anchor, replacement, _COUNTS.get(anchor, 1))
    return texts
