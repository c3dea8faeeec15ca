"""The resolved plan of a run, printed by ``train.py --dry-run`` (and at start-up)."""

from __future__ import annotations

from slime.arguments.megatron_shape import shape_flags_given, shape_mismatches
from slime.launch.memory_plan import describe_memory
from slime.rollout.tcod import curriculum_depth
from slime.utils.hf_config import read_config


def describe_plan(args) -> list[str]:
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    engines = max(1, (args.rollout_num_gpus or 1) // max(1, args.rollout_num_gpus_per_engine))
    lines = [
        f"trainer   : {args.train_backend}, {world} process(es) "
        f"({args.actor_num_nodes} node(s) x {args.actor_num_gpus_per_node}), policy {args.hf_checkpoint}",
        *_megatron_lines(args, world),
        (f"engines   : slime router {args.sglang_router_ip}:{args.sglang_router_port}" if args.sglang_router_ip
         else f"engines   : {engines} x {args.rollout_backend} "
              f"({args.rollout_num_gpus_per_engine} device(s) each), host {args.engine_host}"
              + (", behind sglang-router (cache_aware) on 127.0.0.1" if engines > 1 else "")),
        f"steps     : {args.num_rollout} rollouts x {args.rollout_batch_size} prompts x "
        f"{args.n_samples_per_prompt} samples; global batch {args.global_batch_size}, "
        f"{args.num_steps_per_rollout} optimizer step(s) per rollout",
        f"algorithm : {args.loss_type}, estimator {args.advantage_estimator}, lr {args.lr}, "
        f"eps_clip {args.eps_clip}/{args.eps_clip_high}",
    ]
    if args.use_opd:
        teacher = f"server at {args.rm_url}" if args.opd_type == "sglang" else f"in-trainer from {args.opd_teacher_load}"
        lines.append(f"OPD       : teacher {teacher} (--opd-type {args.opd_type}), coef {args.opd_kl_coef}")
    else:
        lines.append("OPD       : off")
    if args.max_turns:
        lines.append(f"multi-turn: up to {args.max_turns} turns of {args.max_turn_response_len} tokens, "
                     f"{args.rollout_max_response_len} per trajectory; env {args.rollout_interaction_env_path}, "
                     f"agent loop {args.custom_generate_function_path}")
    if args.use_tcod:
        schedule = []
        step, previous = 0, None
        last = (args.num_rollout or 1) - 1
        while step <= last:
            k = curriculum_depth(step, args.tcod_k_start, args.tcod_eta, args.tcod_k_max)
            if k != previous:
                schedule.append(f"n={step}:k={k}")
                previous = k
            if k == args.tcod_k_max:
                break
            step += args.tcod_eta - step % args.tcod_eta
        extra = f", prefix from {args.tcod_prefix_source}" if args.tcod_mode == "b2f" else ""
        lines.append(f"TCOD      : {args.tcod_mode}, k(n) = min({args.tcod_k_start} + n // {args.tcod_eta}, "
                     f"{args.tcod_k_max}){extra}")
        lines.append("schedule  : " + " ".join(schedule[:12]) + (" ..." if len(schedule) > 12 else ""))
    else:
        lines.append("TCOD      : off")
    if args.kl_ctrl == "adaptive":
        lines.append(f"KL ctrl   : adaptive, target {args.kl_target} per {args.kl_ctrl_unit}, horizon "
                     f"{args.kl_horizon:g}, init coef {args.kl_coef}")
    else:
        lines.append(f"KL ctrl   : fixed coef {args.kl_coef}; KL loss "
                     f"{'on, coef ' + str(args.kl_loss_coef) if args.use_kl_loss else 'off'}")
    lines.append(f"checkpoint: {_checkpoint_plan(args)}")
    lines.extend(describe_memory(args))
    return lines


def _checkpoint_plan(args) -> str:
    """Where checkpoints go and when, in words (no ``every None``): a --save without --save-interval writes none."""
    if not args.save:
        saves = "none saved (no --save)"
    elif args.save_interval:
        saves = f"to {args.save} every {args.save_interval} step(s) and after the last"
    else:
        saves = f"none saved: --save {args.save} without --save-interval"
    return saves + (f"; resumes from --load {args.load}" if args.load else "; starts fresh (no --load)")


def _megatron_lines(args, world: int) -> list[str]:
    """The parallel layout (megatron backend) and whether upstream's model-shape flags match the config."""
    lines = []
    if args.train_backend == "megatron":
        tp = args.tensor_model_parallel_size
        optimizer = ("--use-distributed-optimizer: not implemented: replicated" if args.use_distributed_optimizer
                     else "replicated")
        lines.append(f"parallel  : TP {tp} x DP {world // tp} (PP 1, CP 1), sequence parallel "
                     f"{'on' if args.sequence_parallel else 'off'}; AdamW moments per DP rank: {optimizer}")
    given = shape_flags_given(args)
    config = read_config(args.model_config_json or args.hf_checkpoint) if given else None
    if config is not None:
        problems = shape_mismatches(args, config, "the config")
        lines.append(f"model args: {len(given)} shape flags; " +
                     ("; ".join(problems) if problems else "all agree with the config"))
    return lines


def print_plan(args, notes=()) -> None:
    """``notes``: the defaults taken and the warnings of ``checks.check_launch``."""
    print("slime plan (dry run: nothing started)")
    for line in describe_plan(args):
        print("  " + line)
    for note in notes:
        print("  " + note)
