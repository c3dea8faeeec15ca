"""What ``train.py`` checks and fills in before Ray starts, ``--dry-run`` included.

Validation (``slime.utils.arguments``) checks flag combinations; these checks need the run's files and
plugins: every plugin path imports, the environment is a module exposing ``build_env(sample, args)`` (the
agent loop's one contract), the prompt files exist and parse, a B2F expert prefix has expert actions to
replay, and the token budgets can hold the turns. Where a run would silently do something
else than asked, it is refused with one line naming the flag; where one sensible default exists (a
server teacher's reward hooks, the agent loop for multi-turn flags) it is taken and reported, so the
plan shows what will run. ``preflight`` (real runs only) then checks the models and the teacher server.
"""

from __future__ import annotations

import os

from slime.arguments.argument_error import ArgumentError
from slime.launch.config_keys import config_key_warnings
from slime.launch.data_overlap import overlap_warnings
from slime.launch.output_paths import check_fresh_outputs, check_output_dirs
from slime.launch.plugin_paths import check_plugin_paths, raised_at_import
from slime.launch.resume_notes import resume_notes
from slime.launch.task_envs import check_task_envs
from slime.launch.url_checks import check_rm_url, unused_rm_url_notes

# The hooks that turn a server teacher's replies into the OPD term (upstream's OPD example uses the same).
SERVER_TEACHER_HOOKS = {
    "custom_rm_path": ("--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func"),
    "custom_reward_post_process_path": (
        "--custom-reward-post-process-path",
        "slime.rollout.on_policy_distillation.post_process_rewards",
    ),
}
MULTI_TURN_GENERATE = "examples.multi_turn_tcod.rollout.generate"
TEACHER_PREFIX_GENERATE = "slime.rollout.teacher_prefix.generate"
# The rollout functions of this tree take their prompts from --prompt-data; a custom one may make its own.
BUILT_IN_ROLLOUT_PREFIX = "slime.rollout."
# Generate functions of this tree: none sets a reward without an environment or a reward model.
SHIPPED_GENERATE_PREFIXES = ("slime.", "examples.multi_turn_tcod.")
# Rows of --prompt-data looked at for expert actions (B2F with --tcod-prefix-source expert).
EXPERT_SCAN_ROWS = 64


def check_launch(args) -> list[str]:
    """Refuse (``ArgumentError``) or fill defaults in ``args``; returns the notes to show with the plan."""
    if args.num_rollout is None:
        raise ArgumentError("--num-rollout is required (number of rollout/train steps)")
    notes = _default_server_teacher_hooks(args) + _default_generate_function(args)
    _check_agent_loop(args)
    check_rm_url(args)
    notes += unused_rm_url_notes(args)
    check_output_dirs(args)
    check_fresh_outputs(args)
    notes += config_key_warnings(args)
    _check_cluster(args)
    check_plugin_paths(args)
    _check_env_module(args)
    train_data = _check_data_files(args)
    _check_reward_source(args)
    check_task_envs(args, data_files(args))
    notes += overlap_warnings(args)
    _check_expert_prefix(args, train_data)
    notes += resume_notes(args)
    if args.save and not args.save_interval and args.num_rollout > 0:
        notes.append(f"warning: --save {args.save} without --save-interval: no checkpoint is written (add "
                     "--save-interval N: every N steps and after the last)")
    return notes + budget_warnings(args)


def _default_server_teacher_hooks(args) -> list[str]:
    if not (args.use_opd and args.opd_type == "sglang"):
        return []
    if not args.rm_url:
        raise ArgumentError("--opd-type sglang needs --rm-url: the teacher server's /generate URL "
                            "(e.g. http://127.0.0.1:13141/generate)")
    missing = [name for name in SERVER_TEACHER_HOOKS if not getattr(args, name)]
    if len(missing) == 1:
        # The two hooks share a reply format; pairing a custom one with the default would mismatch it.
        flag, default = SERVER_TEACHER_HOOKS[missing[0]]
        raise ArgumentError(f"--opd-type sglang with only one of the two reward hooks: set {flag} too "
                            f"(the OPD one is {default}), or leave both out for the OPD pair")
    notes = []
    for name in missing:
        flag, default = SERVER_TEACHER_HOOKS[name]
        setattr(args, name, default)
        notes.append(f"default: {flag} {default} (the server teacher's scoring hook)")
    return notes


def _default_generate_function(args) -> list[str]:
    if args.custom_generate_function_path == TEACHER_PREFIX_GENERATE and \
            getattr(args, "tcod_prefix_source", None) == "teacher":
        # validate_prefix_source chose it: say so, since no flag of the command line names it.
        return [f"--tcod-prefix-source teacher: --custom-generate-function-path {TEACHER_PREFIX_GENERATE} (the "
                "agent loop with B2F prefixes from the teacher's own episodes)"]
    if args.custom_generate_function_path or not (args.max_turns or args.use_tcod):
        return []
    # Without it the rollout would generate single-turn answers while the plan shows turns and a schedule.
    args.custom_generate_function_path = MULTI_TURN_GENERATE
    return [f"default: --custom-generate-function-path {MULTI_TURN_GENERATE} (the multi-turn agent loop, "
            "since --max-turns is set)"]


def _check_agent_loop(args) -> None:
    """The example's agent loop, named by hand, reads two settings it would otherwise miss only after Ray starts."""
    if args.custom_generate_function_path not in (MULTI_TURN_GENERATE, TEACHER_PREFIX_GENERATE):
        return
    missing = []
    if not args.max_turns:
        missing.append("--max-turns N (or max_turns in the --custom-config-path YAML)")
    if not args.rollout_interaction_env_path:
        missing.append("--rollout-interaction-env-path MODULE (the environment)")
    if missing:
        raise ArgumentError(f"--custom-generate-function-path {args.custom_generate_function_path} plays multi-turn "
                            f"episodes and needs {' and '.join(missing)}: add {'them' if len(missing) > 1 else 'it'}")


def _check_cluster(args) -> None:
    if args.colocate:
        raise ArgumentError("--colocate is not implemented by this runtime: the trainer and the rollout engines "
                            "always get disjoint devices (slime/ray/engine_placement.py); drop --colocate")
    per_node = args.num_gpus_per_node
    for flag, value in (("--actor-num-gpus-per-node", args.actor_num_gpus_per_node),
                        ("--rollout-num-gpus-per-engine", args.rollout_num_gpus_per_engine)):
        if value > per_node:
            raise ArgumentError(f"{flag} {value} is more than one node holds (--num-gpus-per-node {per_node})")


def _check_env_module(args) -> None:
    """The environment loads the way the agent loop (and expert SFT) load it: a module with build_env."""
    path = getattr(args, "rollout_interaction_env_path", None)
    if not path:
        return
    from examples.multi_turn_tcod.rollout import load_env_module

    try:
        load_env_module(path)
    except ModuleNotFoundError as err:
        parent = path.rpartition(".")[0]
        if err.name == path and parent:  # e.g. examples.agent_envs.make_env: a function's path
            raise ArgumentError(f"--rollout-interaction-env-path {path}: not a module; the environment is a module "
                                f"exposing build_env(sample, args) (upstream's contract), e.g. {parent}") from None
        raise ArgumentError(f"--rollout-interaction-env-path {path}: {type(err).__name__}: {err}") from None
    except (ImportError, ValueError, SyntaxError) as err:
        raise ArgumentError(f"--rollout-interaction-env-path {path}: {type(err).__name__}: {err}") from None
    except Exception as err:  # noqa: BLE001 - a .py environment file whose own code raised
        raise raised_at_import("--rollout-interaction-env-path", path, err) from None


def data_files(args) -> list[tuple[str, str]]:
    """(flag, path) of every prompt file; refuses a missing --prompt-data where the rollout function needs it."""
    if args.num_rollout > 0 and not args.prompt_data and args.rollout_function_path.startswith(BUILT_IN_ROLLOUT_PREFIX):
        raise ArgumentError(f"--prompt-data is required: the rollout function {args.rollout_function_path} takes "
                            "its prompts from it")
    pairs = [("--prompt-data", args.prompt_data)] if args.prompt_data else []
    evals = args.eval_prompt_data or []
    return pairs + [(f"--eval-prompt-data {name}", path) for name, path in zip(evals[0::2], evals[1::2])]


def _check_data_files(args):
    """Every prompt file exists and parses; returns the training set (None without --prompt-data)."""
    from slime.utils.data import DataError, Dataset

    parsed = []
    for flag, path in data_files(args):
        if not os.path.isfile(path):
            raise ArgumentError(f"{flag} {path}: no such file")
        try:
            # The chat template needs the tokenizer, which preflight loads; the rows are checked here.
            parsed.append(Dataset(path, input_key=args.input_key, label_key=args.label_key,
                                  metadata_key=args.metadata_key))
        except DataError as err:
            raise ArgumentError(f"{flag}: {err}") from None
    return parsed[0] if args.prompt_data else None


def _check_reward_source(args) -> None:
    """A run that nothing gives a reward trains on reward 0 at every step (grad norm 0) and ends "done"."""
    if args.allow_no_reward or args.num_rollout == 0 or args.loss_type == "sft_loss":
        return
    sources = (args.use_opd, args.rm_type, args.rm_url, args.custom_rm_path, args.custom_reward_post_process_path,
               args.rollout_interaction_env_path)
    # A rollout or generate function of the user's own may set rewards itself: nothing to tell from here.
    own_code = not args.rollout_function_path.startswith(BUILT_IN_ROLLOUT_PREFIX) or not (
        args.custom_generate_function_path or "slime.").startswith(SHIPPED_GENERATE_PREFIXES)
    if any(sources) or own_code:
        return
    raise ArgumentError("nothing supplies a reward, so every step would train on reward 0: add --use-opd (a teacher), "
                        "a reward model (--rm-type, --custom-rm-path or --rm-url) or an environment "
                        "(--rollout-interaction-env-path), or pass --allow-no-reward if that is intended")


def _check_expert_prefix(args, train_data) -> None:
    """B2F replays expert actions: a task set without them would silently play full episodes."""
    if train_data is None or not (args.use_tcod and args.tcod_mode == "b2f" and args.tcod_prefix_source == "expert"):
        return
    samples = train_data.samples[:EXPERT_SCAN_ROWS]
    if any((s.metadata or {}).get("expert_actions") for s in samples):
        return
    if samples and _env_has_expert(args, samples[0]):
        return
    raise ArgumentError(f"--tcod-prefix-source expert: the first {len(samples)} tasks of --prompt-data have no "
                        "expert actions (metadata['expert_actions']) and the environment gives none, so B2F would "
                        "play every episode in full; add expert actions or use --tcod-prefix-source teacher")


def _env_has_expert(args, sample) -> bool:
    """Whether the environment gives the first task's expert actions, asked as B2F's replay asks: after reset."""
    from examples.multi_turn_tcod.rollout import load_env_module

    path = args.rollout_interaction_env_path
    try:
        env = load_env_module(path).build_env(sample, args)
    except Exception as err:  # noqa: BLE001 - any failure to build is the user's to see, in one line
        raise ArgumentError(f"--rollout-interaction-env-path {path}: building the first task's environment "
                            f"failed: {type(err).__name__}: {err}") from None
    try:
        if not hasattr(env, "expert_actions"):
            return False
        env.reset()
        return bool(env.expert_actions())
    except Exception as err:  # noqa: BLE001 - as above
        raise ArgumentError(f"--rollout-interaction-env-path {path}: the first task's reset() / expert_actions() "
                            f"failed: {type(err).__name__}: {err}") from None
    finally:
        if hasattr(env, "close"):
            env.close()


def budget_warnings(args) -> list[str]:
    """Token budgets that cannot hold what the other flags ask for (warned, with the numbers)."""
    notes = []
    budget = args.rollout_max_response_len
    turn = args.max_turn_response_len
    # A turn limit equal to the budget is the default (a turn may use what is left), not a request.
    if args.max_turns and turn and turn != budget and args.max_turns * turn > budget:
        notes.append(f"warning: --max-turns {args.max_turns} x --max-turn-response-len {turn} = "
                     f"{args.max_turns * turn} tokens of student turns alone, more than --rollout-max-response-len "
                     f"{budget} (the whole trajectory's budget, observations included): long episodes end early")
    context = args.rollout_max_context_len
    if context is not None and context <= budget:
        notes.append(f"warning: --rollout-max-context-len {context} is not more than --rollout-max-response-len "
                     f"{budget}: prompt and response share {context} tokens, so the response budget is never reached")
    from slime.utils.hf_config import read_config

    config = read_config(args.model_config_json or args.hf_checkpoint) or {}
    positions = (config.get("text_config") or config).get("max_position_embeddings")
    longest = context or budget
    if positions and longest > positions:
        notes.append(f"warning: {'--rollout-max-context-len' if context else '--rollout-max-response-len'} "
                     f"{longest} is more than the model's max_position_embeddings {positions} "
                     "(config.json): trajectories past it leave the positions the model was trained on")
    return notes
