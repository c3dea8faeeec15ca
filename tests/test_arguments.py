import pytest

from slime.utils.arguments import ArgumentError, get_parser, parse_args, validate_args
from slime.utils.kl_controller import build_kl_controller

SERVER_OPD = ["--use-opd", "--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate"]
ENV = ["--rollout-interaction-env-path", "examples.agent_envs"]
TCOD = SERVER_OPD + ENV + ["--use-tcod", "--max-turns", "30", "--tcod-eta", "6"]
ADAPTIVE = ["--advantage-estimator", "ppo", "--kl-ctrl", "adaptive", "--kl-target", "0.1", "--kl-coef", "0.05"]


def validated(argv):
    return validate_args(get_parser().parse_args(argv))


def rejects(argv, flag):
    with pytest.raises(ArgumentError) as err:
        validated(argv)
    assert flag in str(err.value), f"message does not name {flag}: {err.value}"
    return str(err.value)


# Each row breaks exactly one rule; the message must name the flag a user has to fix.
MEGATRON = ["--train-backend", "megatron"]
TP2 = MEGATRON + ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"]

RULES = [
    (["--rollout-temperature", "0"], "--rollout-temperature"),
    (["--rollout-temperature", "-0.5"], "--rollout-temperature"),
    (["--actor-num-nodes", "0"], "--actor-num-nodes"),
    (["--actor-num-gpus-per-node", "0"], "--actor-num-gpus-per-node"),
    (["--max-turns", "0"], "--max-turns"),
    (["--save-interval", "0"], "--save-interval"),
    (["--eps-clip-c", "1.0"], "--eps-clip-c"),
    (["--rollout-batch-size", "0"], "--rollout-batch-size"),
    (["--n-samples-per-prompt", "0"], "--n-samples-per-prompt"),
    (["--rollout-max-response-len", "0"], "--rollout-max-response-len"),
    (["--micro-batch-size", "0"], "--micro-batch-size"),
    (["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "3"], "--global-batch-size"),
    (["--global-batch-size", "0"], "--global-batch-size"),
    (["--eval-temperature", "-1"], "--eval-temperature"),
    (["--rollout-top-p", "0"], "--rollout-top-p"),
    (["--rollout-top-p", "1.5"], "--rollout-top-p"),
    (["--eval-prompt-data", "name"], "--eval-prompt-data"),
    # on-policy distillation
    (["--opd-teacher-load", "/nonexistent"], "--opd-teacher-load"),
    (["--use-opd"], "--opd-type"),
    (["--use-opd", "--opd-type", "megatron"], "--opd-teacher-load"),
    (["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "/nonexistent/teacher"], "--opd-teacher-load"),
    (SERVER_OPD + ["--opd-kl-coef", "-0.1"], "--opd-kl-coef"),
    # TCOD
    (["--tcod-prefix-source", "expert"], "--tcod-prefix-source"),
    (ENV + ["--use-tcod", "--max-turns", "5", "--tcod-eta", "6"], "--use-opd"),
    (SERVER_OPD + ENV + ["--use-tcod", "--tcod-eta", "6"], "max_turns"),
    (SERVER_OPD + ENV + ["--use-tcod", "--max-turns", "30"], "--tcod-eta"),
    (SERVER_OPD + ENV + ["--max-turns", "30", "--tcod-eta", "6"], "--use-tcod"),
    (["--max-turns", "3"], "--rollout-interaction-env-path"),
    (ENV + ["--max-turns", "3", "--max-turn-response-len", "0"], "--max-turn-response-len"),
    (TCOD[:-1] + ["0"], "--tcod-eta"),
    (TCOD + ["--tcod-k-start", "0"], "--tcod-k-start"),
    (TCOD + ["--tcod-k-start", "5", "--tcod-k-max", "4"], "--tcod-k-max"),
    (TCOD + ["--tcod-k-max", "31"], "--tcod-k-max"),
    (TCOD + ["--tcod-prefix-source", "expert"], "--tcod-prefix-source"),
    (["--use-opd", "--opd-type", "sglang", *ENV, "--use-tcod", "--max-turns", "30", "--tcod-eta", "5",
      "--tcod-mode", "b2f", "--tcod-prefix-source", "teacher"], "--rm-url"),
    # reward-side KL and its controller
    (["--kl-coef", "-1"], "--kl-coef"),
    (["--kl-loss-coef", "-1"], "--kl-loss-coef"),
    (["--kl-coef", "0.1", "--kl-loss-coef", "0.1"], "--kl-loss-coef"),
    # The slime PR's refusals (its slime_validate_args), before Ray.
    (["--kl-ctrl", "adaptive", "--kl-target", "0.1", "--kl-coef", "0.05"], "--advantage-estimator"),
    (["--advantage-estimator", "gspo", "--kl-ctrl", "adaptive", "--kl-target", "0.1", "--kl-coef", "0.05"],
     "--advantage-estimator"),
    (["--advantage-estimator", "reinforce_plus_plus", "--kl-ctrl", "adaptive", "--kl-target", "0.1", "--kl-coef",
      "0.05"], "--advantage-estimator"),
    (ADAPTIVE[:4] + ["--kl-coef", "0.05"], "--kl-target"),
    (ADAPTIVE[:5] + ["0", "--kl-coef", "0.05"], "--kl-target"),
    (ADAPTIVE + ["--kl-horizon", "0"], "--kl-horizon"),
    (ADAPTIVE[:-1] + ["0"], "--kl-coef"),
    (ADAPTIVE + ["--kl-target", "nan"], "--kl-target"),
    (ADAPTIVE + ["--kl-horizon", "inf"], "--kl-horizon"),
    (ADAPTIVE + ["--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--kl-horizon", "31"], "--kl-horizon"),
    (["--kl-target", "0.1"], "--kl-target"),
    (["--kl-horizon", "500"], "--kl-horizon"),
    # non-finite floats (nan <= 0 is False, so range checks alone would pass them)
    (["--rollout-temperature", "nan"], "--rollout-temperature"),
    (["--lr", "inf"], "--lr"),
    (["--eps-clip", "nan"], "--eps-clip"),
    (["--kl-coef=-inf"], "--kl-coef"),
    (["--opd-kl-coef", "nan"], "--opd-kl-coef"),
    (["--clip-grad", "inf"], "--clip-grad"),
    # signs and ranges that used to fail only after start-up, or silently do nothing
    (["--num-rollout", "0"], "--num-rollout"),
    (["--num-rollout", "-3"], "--num-rollout"),
    (["--num-rollout", "0", "--eval-prompt-data", "x", "y", "--eval-interval", "1", "--skip-eval-before-train"],
     "--num-rollout"),
    (["--eps-clip", "-1"], "--eps-clip"),
    (["--eps-clip", "0"], "--eps-clip"),
    (["--eps-clip-high", "-0.1"], "--eps-clip-high"),
    (["--eval-interval", "-1"], "--eval-interval"),
    (["--eval-interval", "0"], "--eval-interval"),
    (["--lr", "-1"], "--lr"),
    (["--critic-lr=-1e-3"], "--critic-lr"),
    (["--weight-decay", "-0.1"], "--weight-decay"),
    (["--adam-beta1", "1"], "--adam-beta1"),
    (["--adam-beta2", "-0.5"], "--adam-beta2"),
    (["--adam-eps=-1e-8"], "--adam-eps"),
    (["--gamma", "1.5"], "--gamma"),
    (["--lambd", "-0.1"], "--lambd"),
    (["--value-clip", "0"], "--value-clip"),
    (["--n-samples-per-eval-prompt", "0"], "--n-samples-per-eval-prompt"),
    (["--rollout-concurrency", "0"], "--rollout-concurrency"),
    (["--num-steps-per-rollout", "0"], "--num-steps-per-rollout"),
    (["--rollout-num-gpus-per-engine", "0"], "--rollout-num-gpus-per-engine"),
    (["--sglang-mem-fraction-static", "1.5"], "--sglang-mem-fraction-static"),
    # trainer memory
    (["--recompute-granularity", "selective"], "--recompute-granularity"),
    (["--recompute-method", "uniform"], "--recompute-granularity"),
    (["--recompute-granularity", "full", "--recompute-num-layers", "2"], "--recompute-num-layers"),
    (["--recompute-granularity", "full", "--recompute-method", "block"], "--recompute-method"),
    (["--use-dynamic-batch-size"], "--max-tokens-per-gpu"),
    (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "0"], "--max-tokens-per-gpu"),
    (["--max-tokens-per-gpu", "4096"], "--use-dynamic-batch-size"),
    (["--gpu-memory-gb", "0"], "--gpu-memory-gb"),
    (["--model-config-json", "/nonexistent/config.json"], "--model-config-json"),
    # upstream's Megatron flags
    (["--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"], "--tensor-model-parallel-size"),
    (["--sequence-parallel"], "--sequence-parallel"),
    (MEGATRON + ["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size"),
    (MEGATRON + ["--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "3"],
     "--tensor-model-parallel-size"),
    (TP2 + ["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size"),
    (TP2 + ["--context-parallel-size", "2"], "--context-parallel-size"),
    (TP2 + ["--expert-model-parallel-size", "2"], "--expert-model-parallel-size"),
    (TP2 + ["--expert-tensor-parallel-size", "2"], "--expert-tensor-parallel-size"),
    (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size"),
    (["--attention-dropout", "0.1"], "--attention-dropout"),
    (["--hidden-dropout", "0.1"], "--hidden-dropout"),
    (["--optimizer", "sgd"], "--optimizer"),
    (["--lr-decay-style", "cosine"], "--lr-decay-style"),
    (["--num-experts", "8"], "--num-experts"),
    (["--balance-data"], "--balance-data"),
    (["--num-layers", "0"], "--num-layers"),
    (["--norm-epsilon", "0"], "--norm-epsilon"),
    (["--rotary-percent", "1.5"], "--rotary-percent"),
    (["--use-rotary-position-embeddings", "--position-embedding-type", "learned_absolute"],
     "--position-embedding-type"),
    (TP2 + ["--num-attention-heads", "3"], "--tensor-model-parallel-size"),
    (TP2 + ["--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "1"], "--num-query-groups"),
    (["--ref-ckpt-step", "-1"], "--ref-ckpt-step"),
    (["--opd-teacher-ckpt-step", "3"], "--opd-teacher-load"),
]


@pytest.mark.parametrize("argv,flag", RULES, ids=[" ".join(a) for a, _ in RULES])
def test_each_rule_rejects_and_names_the_flag(argv, flag):
    rejects(argv, flag)


def test_defaults_mean_no_opd_no_tcod_fixed_kl():
    args = validated([])
    assert not args.use_opd and not args.use_tcod and args.opd_type is None
    assert args.kl_ctrl == "fixed" and args.kl_coef == 0.0
    assert args.kl_target is None and args.kl_horizon is None  # read only by --kl-ctrl adaptive


def test_derived_defaults_are_filled():
    args = validated(["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--eps-clip", "0.3",
                      "--hf-checkpoint", "/m", "--rollout-temperature", "0.7", "--rollout-max-response-len", "64"])
    assert args.global_batch_size == 8 and args.num_steps_per_rollout == 1
    assert args.eps_clip_high == 0.3 and args.ref_load == "/m"
    assert args.eval_temperature == 0.7 and args.max_turn_response_len == 64
    args = validated(["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "2"])
    assert args.num_steps_per_rollout == 4


def test_valid_opd_configurations(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    args = validated(["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(teacher)])
    assert args.opd_teacher_load == str(teacher) and args.opd_kl_coef == 1.0
    assert validated(SERVER_OPD).opd_type == "sglang"


def test_server_teacher_with_other_temperature_warns():
    with pytest.warns(UserWarning, match="--rollout-temperature"):
        validated(SERVER_OPD + ["--rollout-temperature", "0.7"])


def test_tcod_fills_k_max_and_b2f_prefix_source():
    args = validated(TCOD)  # the default rollout function: the agent loop reads the step from sample_hooks
    assert args.rollout_function_path == "slime.rollout.sglang_rollout.generate_rollout"
    assert (args.tcod_mode, args.tcod_k_start, args.tcod_k_max, args.tcod_prefix_source) == ("f2b", 1, 30, None)
    args = validated(TCOD + ["--tcod-mode", "b2f", "--tcod-k-max", "20"])
    assert args.tcod_k_max == 20 and args.tcod_prefix_source == "expert"
    args = validated(TCOD + ["--tcod-mode", "b2f", "--tcod-prefix-source", "teacher"])
    assert args.tcod_prefix_source == "teacher"


def test_valid_adaptive_controller():
    args = validated(ADAPTIVE)
    ctrl = build_kl_controller(args)
    assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.05, 0.1, 10000.0)


def test_parse_args_exits_through_parser_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv=["--use-opd"])
    assert exit_info.value.code == 2
    assert "--opd-type" in capsys.readouterr().err


def test_parse_args_accepts_custom_arguments():
    def add(parser):
        parser.add_argument("--my-flag", type=int, default=3)
        return parser  # upstream slime's hook contract: return the parser

    args = parse_args(add, argv=["--my-flag", "7"])
    assert args.my_flag == 7 and args.global_batch_size == args.rollout_batch_size * args.n_samples_per_prompt

    def add_and_forget_to_return(parser):
        parser.add_argument("--other-flag", type=int, default=3)

    assert parse_args(add_and_forget_to_return, argv=["--other-flag", "5"]).other_flag == 5


def test_missing_teacher_path_is_reported_as_missing(tmp_path):
    message = rejects(["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(tmp_path / "absent")],
                      "--opd-teacher-load")
    assert "does not exist" in message


def test_server_teacher_rejects_a_teacher_checkpoint(tmp_path):
    message = rejects(SERVER_OPD + ["--opd-teacher-load", str(tmp_path)], "--opd-teacher-load")
    assert "sglang" in message


def test_non_finite_message_says_finite():
    assert "finite" in rejects(["--rollout-temperature", "nan"], "--rollout-temperature")


def test_custom_float_flags_are_checked_for_finiteness(capsys):
    def add(parser):
        parser.add_argument("--my-scale", type=float, default=1.0)
        return parser

    with pytest.raises(SystemExit):
        parse_args(add, argv=["--my-scale", "nan"])
    assert "--my-scale must be a finite number" in capsys.readouterr().err


def test_evaluation_only_run_may_have_zero_rollouts():
    # benchmarks/tcod_vs_opd.sh evaluates a checkpoint with --num-rollout 0 (step -1 only).
    args = validated(["--num-rollout", "0", "--eval-prompt-data", "set", "file.jsonl", "--eval-interval", "1"])
    assert args.num_rollout == 0


def test_memory_flags_resolve_like_slime():
    args = validated(["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
                      "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384"])
    assert args.gradient_checkpointing and args.log_probs_max_tokens_per_gpu == 16384
    assert validated([]).log_probs_chunk_size > 0 and not validated([]).gradient_checkpointing


def test_megatron_flags_default_to_not_given_and_tp_1():
    args = validated([])
    assert args.train_backend == "fsdp" and args.tensor_model_parallel_size == 1
    assert (args.pipeline_model_parallel_size, args.context_parallel_size, args.expert_model_parallel_size,
            args.expert_tensor_parallel_size) == (1, 1, 1, 1)
    assert args.num_layers is None and args.hidden_size is None and args.rotary_base is None
    assert args.add_bias_linear and not args.swiglu and not args.sequence_parallel
    assert args.attention_dropout == 0.0 and args.optimizer == "adam" and args.lr_decay_style == "constant"
    assert args.ref_ckpt_step is None and args.opd_teacher_ckpt_step is None


def test_megatron_backend_is_accepted_with_upstream_flags():
    args = validated(TP2 + ["--sequence-parallel", "--num-attention-heads", "32", "--group-query-attention",
                            "--num-query-groups", "8", "--disable-bias-linear", "--use-rotary-position-embeddings",
                            "--attention-backend", "flash", "--bf16", "--use-distributed-optimizer",
                            "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"])
    assert args.tensor_model_parallel_size == 2 and args.sequence_parallel
    assert args.num_query_groups == 8 and not args.add_bias_linear and args.position_embedding_type == "rope"


def test_fsdp_rejection_says_which_backend_is_needed():
    fsdp_tp2 = ["--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"]
    assert "needs --train-backend megatron" in rejects(fsdp_tp2, "--tensor-model-parallel-size")
    assert "not supported by this trainer yet" in rejects(TP2 + ["--pipeline-model-parallel-size", "2"],
                                                          "--pipeline-model-parallel-size")
    assert "mixture-of-experts" in rejects(["--num-experts", "8"], "--num-experts")
    assert "only constant is implemented" in rejects(["--lr-decay-style", "linear"], "--lr-decay-style")


def test_sequence_parallel_with_tp_1_is_switched_off_as_megatron_does():
    with pytest.warns(UserWarning, match="--sequence-parallel"):
        args = validated(MEGATRON + ["--sequence-parallel"])
    assert not args.sequence_parallel


def test_query_groups_follow_megatrons_rule():
    with pytest.warns(UserWarning, match="--group-query-attention"):
        args = validated(["--num-attention-heads", "32", "--num-query-groups", "8"])
    assert args.num_query_groups == 32  # without the switch every head is its own group
    assert validated(["--num-attention-heads", "32", "--group-query-attention"]).num_query_groups == 1


def test_chat_template_kwargs_are_a_json_object(capsys):
    assert get_parser().parse_args([]).apply_chat_template_kwargs == {}
    args = get_parser().parse_args(["--apply-chat-template-kwargs", '{"enable_thinking": false}'])
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}  # what the agent loop's renders get
    for bad in ("[1]", "{oops"):
        with pytest.raises(SystemExit):
            get_parser().parse_args(["--apply-chat-template-kwargs", bad])
    assert "--apply-chat-template-kwargs" in capsys.readouterr().err
