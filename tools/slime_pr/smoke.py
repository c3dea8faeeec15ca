"""CPU smoke run of the ported TCOD PR inside upstream slime's own rollout flow.

    python tools/slime_pr/smoke.py PORTED_SLIME_DIR

This process imports slime from PORTED_SLIME_DIR only (ray, sglang and sglang_router stubbed, as upstream's CPU tests
stub them); tiny student and teacher models are served by this project's ``hf_engine``, the student's also standing in
for the router. Through upstream's parser, data source, ``set_current_rollout_id``, default ``generate_rollout`` ->
``generate_and_rm`` -> the agent loop on gridnav -> ``async_rm`` -> the OPD teacher, then the reward post-processing
as upstream's RolloutManager calls it, checked for F2B and B2F with ``--opd-type sglang``: each step's depth and the
B2F prefix (``max(0, L_exp - k(n))`` expert turns, untrained); one teacher call per trajectory and
``teacher_log_probs`` equal to the teacher's own scores; ``loss_mask`` covering exactly the student turns, removed
samples untrained, every reward 0 (pure OPD); the rollout-log hook's depth and per-turn KL. With ``--opd-type
megatron``: reward 0.0, the environment's return in ``metadata["task_reward"]``, no teacher call. Upstream's
``slime_validate_args`` passes the default rollout function, leaves ``tcod_k_max`` to the agent loop's ``max_turns``,
adds the curriculum's sample hook and refuses each broken rule naming its flag. One line per check; exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # for tools.slime_pr.trees; the upstream side takes it out again
from tools.slime_pr import trees  # noqa: E402

STUBBED_PACKAGES = ("ray", "sglang", "sglang_router")  # GPU / cluster packages, never imported for real
RESULTS: list[tuple[bool, str]] = []


def check(ok: bool, what: str) -> bool:
    RESULTS.append((bool(ok), what))
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
    return bool(ok)


# ---------------------------------------------------------------------------- stubs
def use_upstream_tree(slime_dir: Path) -> None:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO]
    sys.path.insert(0, str(slime_dir))
    trees.install(STUBBED_PACKAGES)
    import slime

    if Path(slime.__file__).resolve().parent != slime_dir / "slime":
        raise SystemExit(f"smoke.py: 'import slime' resolved to {slime.__file__}, not {slime_dir}/slime")


# ---------------------------------------------------------------------------- engines (this project)
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RUNTIME_ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}  # this project's processes


def runtime(*argv: str, **kwargs):
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=RUNTIME_ENV, check=True, **kwargs)


def start_engine(model: Path, log: Path):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "slime.backends.hf_engine", "--model-path", str(model),
                                "--host", "127.0.0.1", "--port", str(port)], cwd=REPO, env=RUNTIME_ENV,
                               stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"smoke.py: hf_engine for {model} exited; see {log}")
        try:
            urllib.request.urlopen(f"{url}/health_generate", timeout=5).read()
            return process, url, port
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"smoke.py: hf_engine for {model} did not become healthy in 180 s; see {log}")


def server_info(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/get_server_info", timeout=30) as reply:
        return json.loads(reply.read())


# ---------------------------------------------------------------------------- upstream args
def upstream_args(argv: list[str], student_port: int, model: Path):
    from slime.utils import arguments

    parser = arguments.get_slime_extra_args_provider()(argparse.ArgumentParser())
    args = parser.parse_args(argv)
    # What upstream's separate SGLang parser and its launcher would add.
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", student_port
    args.sglang_server_concurrency, args.sglang_dp_size, args.rollout_num_engines = 8, None, 1
    args.sglang_enable_deterministic_inference = False
    args.use_distributed_post = False
    args.rollout_num_gpus, args.rollout_num_gpus_per_engine = 1, 1
    args.hf_checkpoint = str(model)
    return args


# Set by upstream's pre-parser and Megatron's parser, which this CPU run does not build. They are
# filled with None only when slime_validate_args asks for them, and listed in the output.
FILLED: set[str] = set()


def validate_through_upstream(args) -> str | None:
    """Run upstream's slime_validate_args; None if it passed, else the error text."""
    import re

    from slime.utils import arguments

    for name in FILLED:
        if not hasattr(args, name):
            setattr(args, name, None)
    for _ in range(200):
        try:
            arguments.slime_validate_args(args)
        except AttributeError as err:
            missing = re.search(r"has no attribute '(\w+)'", str(err))
            if not missing or missing.group(1) in FILLED:
                return f"AttributeError: {err}"
            FILLED.add(missing.group(1))
            setattr(args, missing.group(1), None)
        except Exception as err:  # noqa: BLE001 - the message is what is checked
            return f"{type(err).__name__}: {err}"
        else:
            return None
    return "slime_validate_args kept asking for attributes"


# ---------------------------------------------------------------------------- the run
def rollout(args, rollout_id: int, data_source, teacher_url: str):
    """The step's samples, and how many requests the teacher server got meanwhile."""
    from slime.rollout.base_types import call_rollout_fn
    from slime.rollout.sample_hooks import set_current_rollout_id
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.misc import load_function

    before = server_info(teacher_url)["generate_requests"]
    set_current_rollout_id(rollout_id)  # what RolloutManager.generate does before calling the rollout function
    output = call_rollout_fn(load_function(args.rollout_function_path), args, rollout_id, data_source, evaluation=False)
    GenerateState(args).reset()
    samples = [s for group in output.samples for s in (group if isinstance(group, list) else [group])]
    return samples, server_info(teacher_url)["generate_requests"] - before


def teacher_scores(teacher_model, tokens: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = teacher_model(torch.tensor([tokens])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [logp[i - 1, tokens[i]].item() for i in range(1, len(tokens))]


def check_step(args, mode: str, step: int, samples, teacher_model, expert_len: dict, calls: int):
    from slime.rollout.tcod import curriculum_depth
    from slime.utils.misc import load_function

    depth = curriculum_depth(step, args.tcod_k_start, args.tcod_eta, args.tcod_k_max or args.max_turns)
    tag = f"{mode} step {step} (k={depth})"
    plans_ok = all((s.metadata.get("episode_plan") or {}).get("depth") == depth for s in samples)
    check(plans_ok, f"{tag}: every sample carries the step's plan")
    if mode == "f2b":
        check(all(s.metadata["num_turns"] <= depth for s in samples), f"{tag}: no episode plays more than k turns")
        check(all(s.metadata["prefix_turns"] == 0 for s in samples), f"{tag}: f2b plays from reset")
    else:
        playable = [s for s in samples if s.metadata.get("variant") != "broken"]
        want = {s.index: max(0, expert_len[s.label] - depth) for s in playable}
        got = {s.index: s.metadata["prefix_turns"] for s in playable}
        check(got == want, f"{tag}: b2f replays max(0, L_exp - k) expert turns {sorted(set(want.values()))}")
        check(all(s.metadata["prefix_turns"] + s.metadata["num_turns"] <= args.max_turns for s in samples),
              f"{tag}: b2f's replayed and student turns together stay within max_turns ({args.max_turns})")
    # Upstream's OPD hook scores every sample the generate function left unrewarded, removed ones too.
    check(calls == len(samples), f"{tag}: {calls} teacher calls for {len(samples)} trajectories (one each)")
    # A B2F replay that fills the response budget (--rollout-max-response-len 160 here) ends the episode
    # before the student plays: nothing to train, so it is dropped too (seen in some runs only, at b2f step 2).
    should_drop = {s.index for s in samples if s.metadata.get("variant") == "broken"
                   or (mode == "b2f" and step == 0 and s.metadata.get("variant") == "replay_finishes")
                   or (mode == "b2f" and s.metadata.get("outcome") == "context_full" and not any(s.loss_mask or []))}
    dropped = {s.index for s in samples if s.remove_sample}
    if should_drop or dropped:
        outcomes = sorted({s.metadata["outcome"] for s in samples if s.remove_sample})
        check(dropped == should_drop, f"{tag}: remove_sample set on exactly the failed episode / finished replay "
                                      f"({len(dropped)}: {outcomes})")

    # Upstream logs a rollout (custom hook first) before it post-processes the rewards.
    extra = {}
    load_function(args.custom_rollout_log_function_path)(step, args, samples, extra, 0.0)
    check(extra.get("tcod/depth") == depth and extra.get("tcod/teacher_scored") == 1.0 and "tcod/kl_turn_1" in extra,
          f"{tag}: the rollout-log hook logs tcod/depth, tcod/teacher_scored and per-turn KL")
    # Upstream's RolloutManager._post_process_rewards with a custom hook, then its train-data rules.
    post = load_function(args.custom_reward_post_process_path)
    raw, rewards = post(args, samples)
    check(len(raw) == len(rewards) == len(samples), f"{tag}: post-processing returns one reward per sample")
    check(rewards == [0.0] * len(samples), f"{tag}: every reward is 0 (pure OPD), whatever the environment returned")
    layout_ok, teacher_ok = True, True
    for s in samples:
        mask = [0] * s.response_length if s.remove_sample else s.loss_mask  # what upstream trains on
        trained = {t for t, m in enumerate(mask) if m}
        turns = {t for a, b in s.metadata["turn_spans"] for t in range(a, b)} if not s.remove_sample else set()
        layout_ok &= len(s.loss_mask) == s.response_length >= 1 and trained == turns
        layout_ok &= len(s.teacher_log_probs) == s.response_length
        if not s.remove_sample:
            scores = teacher_scores(teacher_model, s.tokens)[-s.response_length:]
            teacher_ok &= max(abs(a - b) for a, b in zip(scores, s.teacher_log_probs, strict=True)) < 1e-3
    check(layout_ok, f"{tag}: loss masks cover exactly the student turns; teacher log-probs per response token")
    check(teacher_ok, f"{tag}: teacher log-probs equal the teacher model's own scores")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="CPU smoke run of TCOD inside upstream slime's rollout flow")
    parser.add_argument("slime_dir", type=Path, help="an upstream slime tree after port.py")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    opts = parser.parse_args(argv)
    slime_dir = opts.slime_dir.resolve()
    work = Path(tempfile.mkdtemp(prefix="tcod_smoke_"))
    print(f"smoke.py: upstream tree {slime_dir}, work folder {work}", flush=True)

    # Tiny student and teacher (one tokenizer), and gridnav tasks: this project's runtime makes them.
    make = ("from slime.utils.tiny_models import save_tiny_checkpoint as s; import sys; "
            "s(sys.argv[1], hidden_size=32, num_layers=2, num_heads=2, seed=int(sys.argv[2]))")
    runtime("-c", make, str(work / "student"), "3")
    runtime("-c", make, str(work / "teacher"), "11")
    data = work / "tasks.jsonl"
    subprocess.run([sys.executable, "-m", "examples.multi_turn_tcod.envs.make_data", "--n", "6",
                    "--seed", "0", "--size", "5", "--min-len", "3", "--max-len", "5", "--shaping", "0.25",
                    "--out", str(data)],
                   cwd=slime_dir, check=True, env={**os.environ, "PYTHONPATH": str(slime_dir)})
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    # Two tasks that must never train: one whose environment cannot be built (size 0), and one whose
    # expert path carries an extra action, so B2F's first replay (L_exp - 1 turns) already solves it.
    broken = {**rows[0], "metadata": {**rows[0]["metadata"], "size": 0, "variant": "broken"}}
    extra = {**rows[1], "metadata": {**rows[1]["metadata"], "variant": "replay_finishes",
                                     "expert_actions": rows[1]["metadata"]["expert_actions"] + ["up"]}}
    rows = [broken, extra] + rows
    for row in rows:
        row["label"] = json.dumps({k: v for k, v in row["metadata"].items() if k != "expert_actions"}, sort_keys=True)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    expert_len = {row["label"]: len(row["metadata"]["expert_actions"]) for row in rows}

    engines = []
    try:
        student, student_url, student_port = start_engine(work / "student", work / "student.log")
        engines.append(student)
        teacher, teacher_url, _ = start_engine(work / "teacher", work / "teacher.log")
        engines.append(teacher)
        use_upstream_tree(slime_dir)
        return run_checks(slime_dir, work, data, student_port, teacher_url, expert_len)
    finally:
        for process in engines:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
        if not opts.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


def run_checks(slime_dir: Path, work: Path, data: Path, student_port: int, teacher_url: str, expert_len) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.http_utils import init_http_client

    teacher_model = AutoModelForCausalLM.from_pretrained(work / "teacher", dtype=torch.float32).eval()
    base = ["--rollout-batch-size", "3", "--n-samples-per-prompt", "2", "--prompt-data", str(data),
            "--input-key", "input", "--label-key", "label", "--metadata-key", "metadata",
            "--rollout-max-response-len", "160", "--rollout-temperature", "1.0", "--num-rollout", "4",
            "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
            "--custom-rollout-log-function-path", "examples.multi_turn_tcod.metrics.log_rollout_data"]
    server_opd = ["--use-opd", "--opd-type", "sglang", "--rm-url", f"{teacher_url}/generate",
                  "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                  "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards"]
    tcod = ["--use-tcod", "--tcod-eta", "2"]

    def yaml_config(name: str, extra: str = "") -> list[str]:
        path = work / f"{name}.yaml"
        path.write_text("max_turns: 6\nmax_turn_response_len: 6\n"
                        "rollout_interaction_env_path: examples.multi_turn_tcod.envs.gridnav\n" + extra)
        return ["--custom-config-path", str(path)]

    def parsed(argv):
        return upstream_args(argv, student_port, work / "student")

    # Flags: registered by the port, validated by upstream's slime_validate_args (YAML config included).
    args = parsed(base + server_opd + tcod + yaml_config("multi_turn"))
    error = validate_through_upstream(args)
    if error is not None:
        print(f"      upstream validation said: {error}")
    check(error is None and args.rollout_function_path == "slime.rollout.sglang_rollout.generate_rollout"
          and (args.tcod_mode, args.tcod_k_start, args.tcod_k_max) == ("f2b", 1, None)
          and args.rollout_sample_hook_path == ["slime.rollout.tcod.check_episode_planned"],
          "upstream's slime_validate_args passes TCOD with the default rollout function; defaults f2b, "
          "k_start 1, k_max left to the generate function's max_turns; adds the curriculum's sample hook")
    generate_at = base.index("--custom-generate-function-path")
    no_generate = base[:generate_at] + base[generate_at + 2 :]
    refused = [
        (base + server_opd + ["--use-tcod"] + yaml_config("multi_turn"), "--tcod-eta", "no --tcod-eta"),
        (no_generate + server_opd + tcod + yaml_config("multi_turn"), "--custom-generate-function-path",
         "no generate function that plays the curriculum"),
        (base + tcod + yaml_config("multi_turn"), "--use-opd", "no --use-opd"),
        (base + server_opd + tcod + yaml_config("too_shallow", "tcod_k_start: 3\ntcod_k_max: 2\n"), "--tcod-k-max",
         "k_start > k_max"),
        (base + server_opd + ["--tcod-eta", "2"] + yaml_config("multi_turn"), "--use-tcod", "--tcod-eta alone"),
    ]
    for argv, flag, what in refused:
        error = validate_through_upstream(parsed(argv))
        check(error is not None and error.startswith("ValueError") and flag in error,
              f"upstream's slime_validate_args refuses {what}, naming {flag} ({error})")
    config = yaml_config("tcod", "tcod_k_max: 4\n")
    args = parsed(base + server_opd + tcod + ["--tcod-mode", "f2b"] + config)
    error = validate_through_upstream(args)
    check(error is None and args.tcod_k_max == 4, "a --custom-config-path YAML sets the TCOD flags and passes")

    print(f"      (Megatron / pre-parser attributes set to None for upstream's validation: {sorted(FILLED)})")
    init_http_client(args)
    for mode in ("f2b", "b2f"):
        args = parsed(base + server_opd + tcod + ["--tcod-mode", mode] + config)
        validate_through_upstream(args)
        GenerateState.clear_instances()  # upstream's singleton holds the args it was made with
        data_source = RolloutDataSourceWithBuffer(args)
        for step in (0, 2, 6):
            samples, calls = rollout(args, step, data_source, teacher_url)
            check_step(args, mode, step, samples, teacher_model, expert_len, calls)

    # --opd-type megatron: the teacher runs in the trainer, so the rollout hands GRPO a reward of 0.0. B2F,
    # because its replayed expert steps earn the tasks' shaping reward: the environment returns are not 0.
    (work / "teacher_torch_dist").mkdir(exist_ok=True)
    megatron_opd = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(work / "teacher_torch_dist")]
    args = parsed(base + megatron_opd + tcod + ["--tcod-mode", "b2f"] + config)
    error = validate_through_upstream(args)
    check(error is None, f"upstream's slime_validate_args passes TCOD with --opd-type megatron ({error})")
    GenerateState.clear_instances()
    data_source = RolloutDataSourceWithBuffer(args)
    for step in (0, 2):
        samples, calls = rollout(args, step, data_source, teacher_url)
        tag = f"megatron b2f step {step}"
        check(calls == 0 and all(s.teacher_log_probs is None for s in samples),
              f"{tag}: no teacher server call, no teacher log-probs at rollout time ({calls} calls)")
        returns = sorted({float(s.metadata["task_reward"]) for s in samples})
        check(all(s.reward == 0.0 for s in samples) and any(returns),
              f"{tag}: the agent loop sets reward 0.0 on all {len(samples)} samples (environment returns {returns} "
              "kept in metadata['task_reward'])")

    failed = [what for ok, what in RESULTS if not ok]
    print(f"smoke.py: {len(RESULTS) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
