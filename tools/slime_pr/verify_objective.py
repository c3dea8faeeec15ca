"""Both teacher modes train pure OPD, in upstream slime as in this runtime: the same per-token advantages.

    python tools/slime_pr/verify_objective.py PORTED_OR_PRISTINE_SLIME_DIR

Pure OPD: the estimator gets a reward of 0.0 per sample whatever the environment returned (kept in
``metadata["task_reward"]``), so the advantage is ``-opd_kl_coef * (student - teacher)``. With ``--opd-type sglang``
the agent loop leaves ``sample.reward`` None, upstream's OPD ``reward_func`` stores the teacher's reply and its
``post_process_rewards`` returns 0.0; with ``--opd-type megatron`` it sets ``sample.reward = 0.0``, which upstream's
GRPO group normalisation hands on even when ``--n-samples-per-prompt`` > 1. The same samples (objective_cases.py) go
through upstream, in a subprocess importing slime only from the given tree (``rm_hub.async_rm`` against a fake
teacher, the ``RolloutManager``'s reward post-processing and data split, the Megatron actor's ``_get_rollout_data``,
``compute_advantages_and_returns``; ``STUBBED_PACKAGES`` stubbed, the accelerator ``cpu``, given log-probs standing in
for the Megatron forwards), and through this runtime (``assign_rewards``, ``select_trainable``,
``RolloutTrainer.train`` with scoring given and no optimiser step). Checked per case (grpo; 1, 2 and 4 samples per
prompt; student log-probs from the rollout or recomputed), to 1e-6: the rewards handed to the estimator (0), teacher
log-probs, every response token's advantage (upstream's sglang mode = this runtime = upstream's megatron mode = the
closed form), the OPD reverse KL kept for logging, identical teacher requests. Negative controls (upstream with a hook
returning the environment's return, megatron mode with the return as ``sample.reward``) must differ. ``INFO`` lines
are not checked. Exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # for tools.slime_pr.trees; the upstream side takes it out again
from tools.slime_pr import trees  # noqa: E402
from tools.slime_pr.objective_cases import Report, TeacherServer, build_spec, compare  # noqa: E402
from tools.slime_pr.objective_cases import teacher_response_log_probs  # noqa: E402

# Packages upstream imports that this CPU process cannot (or need not) load: stubbed for imports only.
STUBBED_PACKAGES = ("ray", "sglang", "sglang_router", "megatron", "wandb", "psutil", "torch_memory_saver", "pylatexenc")
OPD_HOOKS = "slime.rollout.on_policy_distillation"
# The negative control's hook: the teacher log-probs as upstream's hook stores them, the environment's
# return as the reward (the old port's behaviour).
TASK_REWARD_HOOK = "_verify_objective_hooks.post_process_task_reward"

# --opd-type megatron runs only parsed here: the teacher checkpoint is never validated nor loaded.
MEGATRON_TEACHER = "/nonexistent/teacher_torch_dist"


def common_flags(case: dict, teacher_url: str, hook: str | None, opd_type: str = "sglang") -> list[str]:
    """slime's flags of an OPD run (the same names upstream and here); ``megatron``: an in-trainer teacher,
    no reward model and upstream's own reward post-processing (``hook`` unused)."""
    if opd_type == "sglang":
        teacher = ["--rm-url", teacher_url, "--custom-rm-path", f"{OPD_HOOKS}.reward_func"]
        teacher += ["--custom-reward-post-process-path", hook]
    else:
        teacher = ["--opd-teacher-load", MEGATRON_TEACHER]
    flags = ["--use-opd", "--opd-type", opd_type, "--opd-kl-coef", str(case["opd_kl_coef"]), *teacher,
             "--advantage-estimator", "grpo", "--n-samples-per-prompt", str(case["n_samples_per_prompt"]),
             "--rollout-batch-size", str(case["rollout_batch_size"])]
    return flags + (["--use-rollout-logprobs"] if case["use_rollout_logprobs"] else [])


def _install_task_reward_hook(opd_module) -> None:
    """Register ``TASK_REWARD_HOOK``: ``opd_module``'s post-process, then the environment's returns."""
    module = types.ModuleType(TASK_REWARD_HOOK.rpartition(".")[0])

    def post_process_task_reward(args, samples, **kwargs):
        opd_module.post_process_rewards(args, samples, **kwargs)
        rewards = [float(s.metadata["task_reward"]) for s in samples]
        return list(rewards), rewards

    module.post_process_task_reward = post_process_task_reward
    sys.modules[module.__name__] = module


def _samples(case: dict, sample_cls, reward: str | None = None) -> list:
    """The case's samples as ``sample_cls`` (upstream's or this runtime's ``Sample``, same fields), their
    ``reward`` None (``--opd-type sglang``: the teacher's reward model fills it), ``"zero"`` (what the agent
    loop sets with ``--opd-type megatron``) or ``"task"`` (the environment's return: the old agent loop)."""
    rewards = {None: lambda s: None, "zero": lambda s: 0.0, "task": lambda s: float(s["task_reward"])}[reward]
    return [
        sample_cls(
            index=s["index"], group_index=s["group_index"], prompt=s["prompt"], response=s["response"],
            tokens=list(s["tokens"]), response_length=s["response_length"], loss_mask=list(s["loss_mask"]),
            rollout_log_probs=list(s["rollout_log_probs"]), metadata={"task_reward": s["task_reward"]},
            status=sample_cls.Status.TRUNCATED if s["truncated"] else sample_cls.Status.COMPLETED, reward=rewards(s),
        )
        for s in case["samples"]
    ]


def _by_index(samples, values) -> dict[str, list[float]]:
    return {str(s.index): [float(v) for v in value] for s, value in zip(samples, values, strict=True)}


# ---------------------------------------------------------------------------- upstream side
def _install_upstream_stubs() -> None:
    trees.install(STUBBED_PACKAGES)
    trees.install_one_rank_mpu()
    import ray

    def remote(*args, **kwargs):
        return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else (lambda obj: obj)

    ray.remote, ray.get, ray.put = remote, (lambda ref: ref), (lambda value, **kwargs: value)
    ray._private = types.SimpleNamespace(services=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))


def _upstream_args(case: dict, teacher_url: str, hook: str | None, normalize: bool, opd_type: str):
    from slime.utils.arguments import get_slime_extra_args_provider

    parser = get_slime_extra_args_provider()(argparse.ArgumentParser(allow_abbrev=False))
    flags = common_flags(case, teacher_url, hook, opd_type) + (["--normalize-advantages"] if normalize else [])
    args = parser.parse_args(flags)
    n_samples = case["n_samples_per_prompt"] * case["rollout_batch_size"]
    # Megatron's parser would set these; one training step holds every sample (rollout) of the batch.
    args.global_batch_size = n_samples
    for name, value in {"micro_batch_size": 1, "max_tokens_per_gpu": None, "balance_data": False}.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    return args


def _upstream_run(case: dict, teacher_url: str, hook: str | None, normalize=False, opd_type="sglang", reward=None):
    import torch

    from slime.backends.megatron_utils import actor as megatron_actor
    from slime.backends.megatron_utils.loss import compute_advantages_and_returns
    from slime.ray.rollout import RolloutManager
    from slime.rollout.rm_hub import async_rm
    from slime.utils.misc import load_function
    from slime.utils.types import Sample

    args = _upstream_args(case, teacher_url, hook, normalize, opd_type)
    samples = _samples(case, Sample, reward)

    async def reward_all():  # generate_and_rm: the reward model runs where the generate function left None
        for sample in samples:
            if sample.reward is None:
                sample.reward = await async_rm(args, sample)

    asyncio.run(reward_all())
    manager = object.__new__(RolloutManager)  # only the reward / train-data methods are used
    manager.args = args
    hook_path = args.custom_reward_post_process_path  # None with --opd-type megatron: upstream's own rules
    manager.custom_reward_post_process_func = load_function(hook_path) if hook_path else None
    manager.custom_convert_samples_to_train_data_func = None
    manager.train_parallel_config = {"dp_size": 1, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    train_data = manager._convert_samples_to_train_data(samples)
    refs = manager._split_train_data_by_dp(train_data)
    rollout_data = megatron_actor.MegatronTrainRayActor._get_rollout_data(types.SimpleNamespace(args=args), refs)
    order = [samples[i] for i in rollout_data["partition"]]
    if not args.use_rollout_logprobs:  # what the actor's compute_log_prob forward would store
        rollout_data["log_probs"] = [torch.tensor(case["samples"][s.index]["recomputed_log_probs"]) for s in order]
    if opd_type == "megatron":  # what the actor's teacher forward stores (compute_log_prob, prefix "teacher_")
        scores = [teacher_response_log_probs(case["samples"][s.index]) for s in order]
        rollout_data["teacher_log_probs"] = [torch.tensor(t, dtype=torch.float32) for t in scores]
    compute_advantages_and_returns(args, rollout_data)
    return {
        "rewards": {str(s.index): float(r) for s, r in zip(order, rollout_data["rewards"], strict=True)},
        "teacher": _by_index(order, rollout_data["teacher_log_probs"]),
        "adv": _by_index(order, rollout_data["advantages"]),
        "opd_kl": _by_index(order, rollout_data["opd_reverse_kl"]),
    }


def upstream_side(tree: Path, spec: dict) -> dict:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).resolve().parent)]
    sys.path.insert(0, str(tree))
    _install_upstream_stubs()
    import torch.distributed as dist

    import slime.backends.megatron_utils.actor
    import slime.backends.megatron_utils.loss
    import slime.ray.rollout
    import slime.rollout.on_policy_distillation as opd
    import slime.rollout.rm_hub  # noqa: F401
    from slime.utils import accelerator

    foreign = sorted(
        name
        for name, module in sys.modules.items()
        if name.split(".")[0] == "slime" and getattr(module, "__file__", None)
        if not Path(module.__file__).resolve().is_relative_to(tree.resolve())
    )
    if foreign:
        raise SystemExit(f"upstream side imported slime modules from outside {tree}: {foreign}")
    accelerator.current_device = lambda: "cpu"  # no accelerator on this machine
    _install_task_reward_hook(opd)
    trees.StubModule.used.clear()
    out = {"cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        # Whitening all-reduces over the data-parallel group: a one-rank gloo group.
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        for case in spec["cases"]:
            url, pure_hook = spec["teacher_url"], f"{OPD_HOOKS}.post_process_rewards"
            runs = {
                "pure": _upstream_run(case, url, pure_hook),
                "task": _upstream_run(case, url, TASK_REWARD_HOOK),
                "pure_whitened": _upstream_run(case, url, pure_hook, True),
            }
            # GRPO normalises within groups: one sample per prompt has no std (upstream gives NaN), so the
            # megatron mode runs where a group exists, as in the GPU e2e test (--n-samples-per-prompt 2).
            if case["n_samples_per_prompt"] > 1:
                runs["megatron_pure"] = _upstream_run(case, url, None, opd_type="megatron", reward="zero")
                runs["megatron_task"] = _upstream_run(case, url, None, opd_type="megatron", reward="task")
            out["cases"][case["name"]] = runs
        dist.destroy_process_group()
    out["stubbed_modules"] = sorted(n for n in sys.modules if n.split(".")[0] in STUBBED_PACKAGES)
    out["stubs_called"] = sorted(set(trees.StubModule.used))
    return out


# ---------------------------------------------------------------------------- runtime side
def _runtime_run(case: dict, teacher_url: str, hook: str, normalize: bool = False) -> dict:
    import torch

    from slime.backends.fsdp_utils.forward import Scores
    from slime.backends.rollout_trainer import RolloutTrainer
    from slime.rollout.rewards import assign_rewards
    from slime.rollout.sglang_rollout import run_async
    from slime.rollout.trainable_samples import select_trainable
    from slime.utils import http_utils
    from slime.utils.arguments import parse_args
    from slime.utils.types import Sample

    args = parse_args(argv=common_flags(case, teacher_url, hook) + (["--normalize-advantages"] if normalize else []))
    recomputed = {s["index"]: s["recomputed_log_probs"] for s in case["samples"]}
    samples = _samples(case, Sample)
    run_async(assign_rewards(args, samples))
    run_async(http_utils.close_session())
    groups = [[s for s in samples if s.group_index == g] for g in range(case["rollout_batch_size"])]
    samples, _ = select_trainable(args, groups)

    class Trainer(RolloutTrainer):
        """The runtime's trainer with scoring given and the optimiser step skipped."""

        def __init__(self):
            self.args, self.device, self.model = args, torch.device("cpu"), torch.nn.Module()
            self.ref = self.teacher = self.critic = None
            self.sft = self.full_opd = False
            self.dp_rank, self.dp_size, self.optimizer_steps = 0, 1, 0
            self.per_sample = None

        def _score(self, model, batch, *, entropy=False, teacher=None):
            return Scores(log_probs=[torch.tensor(recomputed[s.index], dtype=torch.float32) for s in batch])

        def _kl_teacher(self, batch):
            return None, None

        def _train_step(self, samples, step, masks, per_sample, rollout_id=0, step_no=0):
            self.per_sample = per_sample
            return {"loss": 0.0}

    trainer = Trainer()
    metrics = trainer.train(0, samples, 0.0)
    return {
        "rewards": {str(s.index): float(s.reward) for s in samples},
        # As the trainer reads them (float32), like upstream's tensors.
        "teacher": _by_index(samples, [torch.tensor(s.teacher_log_probs) for s in samples]),
        "adv": _by_index(samples, trainer.per_sample["adv"]),
        "opd_kl": _by_index(samples, metrics["per_sample_opd_kl"]),
    }


def runtime_side(spec: dict) -> dict:
    """This runtime's results for every case: its own OPD hook (pure, whitened) and the task-reward control."""
    sys.path.insert(0, str(REPO))
    import slime
    import slime.rollout.on_policy_distillation as opd

    if Path(slime.__file__).resolve().parent != REPO / "slime":
        raise SystemExit(f"runtime side imported slime from {slime.__file__}, not {REPO}/slime")
    _install_task_reward_hook(opd)
    pure = f"{OPD_HOOKS}.post_process_rewards"
    runs = {"pure": (pure, False), "pure_whitened": (pure, True), "task": (TASK_REWARD_HOOK, False)}
    return {"cases": {case["name"]: {v: _runtime_run(case, spec["teacher_url"], *run) for v, run in runs.items()}
                      for case in spec["cases"]}}


# ---------------------------------------------------------------------------- comparison
def _run_side(side: str, tree: Path | None, spec: dict, work: Path) -> dict:
    spec_path, out_path = work / f"{side}_spec.json", work / f"{side}_out.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--spec", str(spec_path)]
    cmd += ["--out", str(out_path)] + (["--tree", str(tree)] if tree else [])
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"{side} side failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(out_path.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slime_dir", nargs="?", type=Path, help="upstream slime tree (pristine or ported)")
    parser.add_argument("--side", choices=("upstream", "runtime"), help=argparse.SUPPRESS)  # _run_side's subprocess
    for internal in ("--tree", "--spec", "--out"):
        parser.add_argument(internal, type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.side:
        spec = json.loads(opts.spec.read_text())
        result = upstream_side(opts.tree, spec) if opts.side == "upstream" else runtime_side(spec)
        opts.out.write_text(json.dumps(result))
        return 0
    if opts.slime_dir is None or not (opts.slime_dir / "slime" / "ray" / "rollout.py").is_file():
        parser.error("give an upstream slime tree (a directory holding slime/ray/rollout.py)")
    report = Report()
    with tempfile.TemporaryDirectory(prefix="verify_objective_") as tmp, TeacherServer() as up_teacher:
        cases = build_spec()
        upstream = _run_side("upstream", opts.slime_dir.resolve(), {"cases": cases, "teacher_url": up_teacher.url},
                             Path(tmp))
        with TeacherServer() as rt_teacher:
            runtime = _run_side("runtime", None, {"cases": cases, "teacher_url": rt_teacher.url}, Path(tmp))
        report.info(f"upstream stubs imported: {', '.join(upstream['stubbed_modules'])}")
        report.info(f"upstream stubs instantiated during the flow: {upstream['stubs_called'] or 'none'}")
        key = lambda payload: json.dumps(payload, sort_keys=True)  # noqa: E731
        up_requests, rt_requests = set(map(key, up_teacher.requests)), set(map(key, rt_teacher.requests))
        report.check(up_requests == rt_requests and len(up_requests) == sum(len(c["samples"]) for c in cases),
                     f"teacher requests: the same {len(up_requests)} distinct payloads on both sides (one per "
                     f"sample; {len(up_teacher.requests)} sent by upstream's runs, {len(rt_teacher.requests)} by "
                     "this runtime's)")
        compare({"cases": cases}, upstream, runtime, report)
    print(f"{'FAILED' if report.failed else 'OK'}: {report.failed} failed check(s)", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
