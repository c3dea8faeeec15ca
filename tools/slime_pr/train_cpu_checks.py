"""What the TCOD cases of ``train_cpu.py`` assert, read from what slime's ``train.py`` wrote.

Inputs are slime's own debug dumps: ``--save-debug-rollout-data`` (each rollout's samples: tokens, loss masks,
rewards, metadata) and ``--save-debug-train-data`` (per rollout and rank, after ``compute_advantages_and_returns``:
``advantages``, ``log_probs``, ``teacher_log_probs``, ``loss_masks``). Nothing here imports the PR: the
schedule is the formula of its docs, ``k(n) = min(k_start + n // eta, k_max)``; the turns an episode played are
counted in its tokens (a student turn is a run of trainable tokens; B2F's replayed expert turns are masked
``action<|im_end|>`` pieces before the first one); the teacher's log-probs are recomputed with transformers on the
teacher checkpoint. Each check raises :class:`CheckFailed` with one line naming the rollout and what differs,
and returns a short summary.
"""

from __future__ import annotations

import ast
import glob
import itertools
import json
import math
import re
from pathlib import Path

import torch

IM_END = "<|im_end|>"
ASSISTANT = "<|im_start|>assistant\n"
ACTIONS = ("up", "down", "left", "right")
# Episodes that may stop before their planned turns: the task was solved (done) or the trajectory budget ran out.
EARLY_OUTCOMES = ("done", "context_full")


class CheckFailed(AssertionError):
    """A TCOD case's claim does not hold; the message is the case's one-line reason."""


def schedule_depth(step: int, k_start: int, eta: int, k_max: int) -> int:
    """TCOD's depth at rollout ``step`` as the PR's docs define it."""
    return min(k_start + step // eta, k_max)


def _load(pattern: str) -> dict[int, list[dict]]:
    """``{rollout_id: samples}`` from slime's dumps. ``pattern`` is the flag's value: ``{rollout_id}`` (and for
    train dumps ``{rank}``; the writing rank holds every data-parallel shard). Evaluation dumps, whose rollout
    id is written ``eval_N``, are left out."""
    regex = re.compile(re.escape(pattern).replace(r"\{rollout_id\}", r"(\d+)").replace(r"\{rank\}", r"\d+") + "$")
    out = {}
    for path in sorted(glob.glob(pattern.replace("{rollout_id}", "*").replace("{rank}", "*"))):
        match = regex.match(path)
        if match:
            out.setdefault(int(match.group(1)), []).extend(torch.load(path, weights_only=False)["samples"])
    return out


def load_rollout_dumps(pattern: str) -> dict[int, list[dict]]:
    return _load(pattern)


def load_train_dumps(pattern: str) -> dict[int, list[dict]]:
    return _load(pattern)


def expert_actions_by_label(data_file: Path) -> dict[str, list[str]]:
    """The tasks' expert actions, from the data file the run trained on (not from the samples)."""
    rows = [json.loads(line) for line in Path(data_file).read_text().splitlines() if line.strip()]
    return {row["label"]: list(row["metadata"]["expert_actions"]) for row in rows}


def _response(sample: dict) -> tuple[list[int], list[int]]:
    n = sample["response_length"]
    mask = list(sample["loss_mask"]) if sample.get("loss_mask") is not None else [1] * n
    return list(sample["tokens"][-n:]) if n else [], mask


def played_turns(sample: dict, tokenizer) -> tuple[list[str], int]:
    """``(replayed expert actions, student turns)`` counted in the sample's response tokens."""
    ids, mask = _response(sample)
    student_turns = sum(1 for m, _ in itertools.groupby(mask) if m)
    first_trained = mask.index(1) if 1 in mask else len(mask)
    prefix = ASSISTANT + tokenizer.decode(ids[:first_trained], skip_special_tokens=False)
    replayed = re.findall(r"<\|im_start\|>assistant\n(?:<think>.*?</think>\s*)?(\w+)<\|im_end\|>", prefix, re.S)
    return [a for a in replayed if a in ACTIONS], student_turns


def check_trained_tokens(rollouts: dict[int, list[dict]], tokenizer) -> str:
    """Only the student's own turns are trained: read from the ChatML markers of the untrained tokens, not from the
    rollout's bookkeeping, every token with loss mask 1 follows an assistant header (the student's text up to its
    stop ``<|im_end|>``) and was sampled (a rollout log-prob other than 0.0, which tokens the rollout adds itself
    carry); headers, user / tool turns (the environment's observations) and the newlines between messages carry 0.
    The response starts inside the assistant message the prompt opened."""
    im_start, im_end = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained = 0
    for step in sorted(rollouts):
        for i, sample in enumerate(rollouts[step]):
            if sample.get("remove_sample"):
                continue
            ids, mask = _response(sample)
            sampled = sample.get("rollout_log_probs")
            if len(mask) != len(ids) or (sampled is not None and len(sampled) != len(ids)):
                raise CheckFailed(f"rollout {step} sample {i}: {len(ids)} response tokens, {len(mask)} loss-mask "
                                  f"entries, {len(sampled or [])} rollout log-probs")
            state, role = "assistant", ""
            for pos, (token, m) in enumerate(zip(ids, mask)):
                if m:  # a sampled token: whatever the student wrote (an untrained one writes <|im_start|> too)
                    if sampled is not None and sampled[pos] == 0.0:  # the engine never gives a sample log p = 0
                        raise CheckFailed(f"rollout {step} sample {i}: response token {pos} "
                                          f"({tokenizer.decode([token])!r}) is trained but was not sampled (rollout "
                                          f"log-prob 0.0: a token the rollout added, such as a cut turn's "
                                          f"closing <|im_end|>)")
                    if state != "assistant":
                        where = {"between": "between two messages", "header": "in a message header"}.get(
                            state, f"in a {role} message")
                        raise CheckFailed(f"rollout {step} sample {i}: response token {pos} "
                                          f"({tokenizer.decode([token])!r}, {where}) is trained; only the student's "
                                          f"assistant turns may be")
                    state = "between" if token == im_end else state  # the student's stop ends its turn
                elif token == im_start:
                    state, role = "header", ""
                elif state == "header":
                    text = tokenizer.decode([token])
                    state = ("assistant" if role == "assistant" else "other") if text == "\n" else state
                    role += "" if text == "\n" else text
                elif token == im_end:
                    state = "between"
                trained += bool(m)
    if not trained:
        raise CheckFailed("no trained token in any rollout")
    return f"{trained} trained tokens, all in assistant turns"


def check_depths(rollouts: dict[int, list[dict]], tokenizer, *, mode: str, k_start: int, eta: int, k_max: int,
                 max_turns: int, experts: dict[str, list[str]]) -> str:
    """Every rollout step plays TCOD's depth k(n): F2B, the student plays k(n) turns from reset (fewer only when the
    episode ended first); B2F, the first ``max(0, L - k(n))`` expert actions are replayed, masked, then the student
    plays to ``max_turns`` turns in all. Each step needs an episode that shows its depth in full."""
    if not rollouts:
        raise CheckFailed("no rollout dumps (--save-debug-rollout-data wrote nothing)")
    seen = []
    for step in sorted(rollouts):
        depth = schedule_depth(step, k_start, eta, k_max)
        full = 0
        for i, sample in enumerate(rollouts[step]):
            if sample.get("remove_sample"):
                continue
            expert = experts.get(sample["label"])
            if expert is None:
                raise CheckFailed(f"rollout {step} sample {i}: label not in the training data")
            replayed, student = played_turns(sample, tokenizer)
            prefix = max(0, len(expert) - depth) if mode == "b2f" else 0
            planned = depth if mode == "f2b" else max_turns - prefix
            where = f"rollout {step} (k(n)={depth}) sample {i}"
            if replayed != expert[:prefix]:
                raise CheckFailed(f"{where}: replayed {replayed}, expected the first {prefix} expert actions "
                                  f"{expert[:prefix]}")
            ended_early = (sample.get("metadata") or {}).get("outcome") in EARLY_OUTCOMES
            if student > planned or (student < planned and not ended_early):
                raise CheckFailed(f"{where}: the student played {student} turns, the schedule says {planned}")
            full += student == planned
        if not full:
            raise CheckFailed(f"rollout {step} (k(n)={depth}): no episode played its {mode} depth in full")
        seen.append(f"{step}:{depth}")
    return f"depths {' '.join(seen)} ({mode})"


@torch.no_grad()
def teacher_response_logprobs(teacher, tokens: list[int], response_length: int) -> torch.Tensor:
    """log p_teacher of each response token given everything before it (one unbatched forward)."""
    ids = torch.tensor([tokens])
    logp = torch.log_softmax(teacher(ids).logits[0, :-1].float(), dim=-1)
    picked = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
    return picked[len(tokens) - 1 - response_length:]


# slime runs Megatron in bf16 (megatron_utils/arguments.py: args.bf16 = not args.fp16), on the CPU too: bf16 keeps 8
# significant bits, so the trainer's log-probs stray from an fp32 transformers forward of the same weights by a
# little on every token, more on long samples (a token's gap reached 0.06 on the teacher). A sample's mean gap over
# its trained tokens is steadier (measured at most 0.001 for the near-uniform student, 0.014 for the teacher). The
# padded vocabulary shifted every log-prob by 0.25 and the student is 4 nats from the teacher; but the tiny student
# is close to uniform, so for it the margin is thinner: another random initialisation of its shape (weights never
# loaded) is an estimated 0.15-0.2 nats away, and a norm weight the loader missed stays at 1.0 on both sides.
BF16_LOGPROB_TOL = 0.05  # a sample's mean |gap| over its trained tokens


def _mean_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return (a - b)[mask].abs().mean().item()


def check_trainer_logprobs(train_step: list[dict], model, *, tol: float = BF16_LOGPROB_TOL) -> str:
    """Before the first update the trainer's log-probs are those of the HF checkpoint it loaded: on trained tokens
    they equal a transformers forward of that checkpoint (within bf16's rounding). A model that Megatron builds
    otherwise (a padded vocabulary, another rope base, weights never loaded) shifts them, and with them what OPD,
    PPO and the KL terms compute, while checks that compare the trainer with itself stay green."""
    worst, checked = 0.0, 0
    for i, sample in enumerate(train_step):
        mask = torch.as_tensor(sample["loss_masks"]).bool()
        if not mask.any():
            continue
        expected = teacher_response_logprobs(model, [int(t) for t in sample["tokens"]], int(sample["response_lengths"]))
        gap = _mean_gap(torch.as_tensor(sample["log_probs"]).float(), expected, mask)
        if not math.isfinite(gap) or gap > tol:
            raise CheckFailed(f"first rollout's train sample {i}: the trainer's log-probs differ from the loaded HF "
                              f"checkpoint's by {gap:.3g} on average (tolerance {tol}): Megatron's model is not the "
                              f"checkpoint")
        worst, checked = max(worst, gap), checked + 1
    if not checked:
        raise CheckFailed("no trained tokens in the first rollout's train dumps")
    return f"trainer log-probs == HF student's on {checked} samples (largest mean gap {worst:.1e}, bf16)"


def same_input_id(reported: int, token: int, vocab_size: int) -> bool:
    """Whether a server's ``input_token_logprobs`` id names ``token``. SGLang 0.5.15.post1 reports the vocabulary's
    last id as 0 (``x if x < vocab_size - 1 else 0``, a clip meant for image-hash padding, one short); only the
    reported id changes, its log-prob is the real token's. A real model's last id is an unused pad; the tiny models'
    is a character ('\\n'), so the check allows the clip. hf_engine reports every id as it is."""
    return reported == token or (token == vocab_size - 1 and reported == 0)


def check_opd_rewards(rollouts: dict[int, list[dict]], teacher, *, opd_type: str, tol: float = 1e-3) -> str:
    """Pure OPD in what the rollout hands the trainer: a sample's reward is not the environment's return
    (``metadata["task_reward"]``, non-zero for B2F's replayed steps) but, with the teacher server, the teacher's
    scoring of exactly the sample's tokens (its response-span log-probs equal to ours), and 0.0 with the
    teacher in the trainer."""
    scored = 0
    vocab = int(teacher.config.vocab_size)
    for step in sorted(rollouts):
        for i, sample in enumerate(rollouts[step]):
            if sample.get("remove_sample"):
                continue
            where, reward = f"rollout {step} sample {i}", sample.get("reward")
            if opd_type == "megatron":
                if reward != 0.0:
                    raise CheckFailed(f"{where}: reward {repr(reward)[:60]} with --opd-type megatron (pure OPD "
                                      f"trains on 0)")
                continue
            entries = (reward.get("meta_info") or {}).get("input_token_logprobs") if isinstance(reward, dict) else None
            if not entries or len(entries) != len(sample["tokens"]):
                raise CheckFailed(f"{where}: reward is not the teacher's scoring of the sample's "
                                  f"{len(sample['tokens'])} tokens (got {type(reward).__name__})")
            if not all(same_input_id(int(e[1]), int(t), vocab) for e, t in zip(entries, sample["tokens"])):
                raise CheckFailed(f"{where}: the teacher scored other tokens than the sample's")
            n = int(sample["response_length"])
            served = torch.tensor([float(e[0]) for e in entries[len(entries) - n:]])
            ours = teacher_response_logprobs(teacher, [int(t) for t in sample["tokens"]], n)
            gap = (served - ours).abs().max().item() if n else 0.0
            if gap > tol:
                raise CheckFailed(f"{where}: the teacher server's log-probs differ from the teacher's by {gap:.3g}")
            scored += 1
    return f"rewards pure OPD ({opd_type}; {scored} teacher-scored samples)"


def check_opd_advantages(train: dict[int, list[dict]], rollouts: dict[int, list[dict]], teacher, *,
                         opd_kl_coef: float, tol: float = 1e-3, min_kl: float = 0.05,
                         teacher_in_trainer: bool = False) -> str:
    """Pure OPD: every sample's reward is 0 and, on its trained tokens, the advantage is
    ``-opd_kl_coef * (log p_student - log p_teacher)``; the loss mask the trainer used is the rollout's (0 on
    observations and replayed turns: the policy loss weights the advantages by it, so masked tokens carry none).
    The teacher's log-probs are recomputed here in fp32; with the teacher in the trainer (``--opd-type megatron``),
    computed there in bf16, the formula is checked on the trainer's own teacher log-probs and those must be the
    teacher's within ``BF16_LOGPROB_TOL``. The reverse KL must be far from 0, or the check proves nothing."""
    if sorted(train) != sorted(rollouts):
        raise CheckFailed(f"train dumps for rollouts {sorted(train)}, rollout dumps for {sorted(rollouts)}")
    kls, worst = [], 0.0
    for step in sorted(train):
        by_tokens = {tuple(s["tokens"]): s for s in rollouts[step]}
        for i, sample in enumerate(train[step]):
            where = f"rollout {step} train sample {i}"
            rolled = by_tokens.get(tuple(int(t) for t in sample["tokens"]))
            if rolled is None:
                raise CheckFailed(f"{where}: its tokens are no sample of the rollout dump")
            mask = torch.as_tensor(sample["loss_masks"]).bool()
            expected_mask = [0] * len(mask) if rolled.get("remove_sample") else list(rolled["loss_mask"])
            if mask.int().tolist() != expected_mask:
                raise CheckFailed(f"{where}: the trainer's loss mask differs from the rollout's")
            if float(sample.get("rewards", 0.0)) != 0.0:
                raise CheckFailed(f"{where}: reward {sample['rewards']} (pure OPD trains on 0)")
            raw = rolled.get("reward")
            if not isinstance(raw, dict) and raw not in (None, 0.0):
                raise CheckFailed(f"{where}: raw reward {raw!r} (pure OPD trains on 0)")
            if not mask.any():
                continue
            teacher_lp = teacher_response_logprobs(teacher, [int(t) for t in sample["tokens"]],
                                                   int(sample["response_lengths"]))
            if teacher_in_trainer:
                trainer_teacher = torch.as_tensor(sample["teacher_log_probs"]).float()
                off = _mean_gap(trainer_teacher, teacher_lp, mask)
                if not math.isfinite(off) or off > BF16_LOGPROB_TOL:
                    raise CheckFailed(f"{where}: the trainer's teacher log-probs differ from the teacher's by "
                                      f"{off:.3g} on average (tolerance {BF16_LOGPROB_TOL}): the trainer scored "
                                      f"with another model")
                teacher_lp = trainer_teacher
            student_lp = torch.as_tensor(sample["log_probs"]).float()
            advantages = torch.as_tensor(sample["advantages"]).float()
            expected = -opd_kl_coef * (student_lp - teacher_lp)
            gap = (advantages - expected)[mask].abs().max().item()
            if not math.isfinite(gap) or gap > tol:
                raise CheckFailed(f"{where}: advantages differ from -opd_kl_coef * (log p_student - log p_teacher) "
                                  f"by {gap:.3g} on trained tokens (tolerance {tol})")
            worst = max(worst, gap)
            kls.append((student_lp - teacher_lp)[mask].abs().mean().item())
    if not kls:
        raise CheckFailed("no trained tokens in any train dump")
    mean_kl = sum(kls) / len(kls)
    if mean_kl < min_kl:
        raise CheckFailed(f"mean |log p_student - log p_teacher| is {mean_kl:.3g}: the teacher is the student")
    return f"OPD advantages == -coef*KL on {len(kls)} samples (max gap {worst:.1e}, mean |KL| {mean_kl:.2f})"


_STEP_LINE = re.compile(r"\bstep (\d+): (\{.*\})\s*$")


def train_step_metrics(log_text: str) -> list[dict]:
    """The trainer's per-step metrics, from the ``step N: {...}`` lines slime's Megatron backend logs."""
    steps = []
    for line in log_text.splitlines():
        match = _STEP_LINE.search(line)
        if match and "'train/" in match.group(2):
            # Python writes a non-finite float bare (nan, inf): quote it for literal_eval, then read it back.
            quoted = re.sub(r"(?<![\w'\"])(-?(?:nan|inf))\b", r"'\1'", match.group(2))
            metrics = ast.literal_eval(quoted)
            steps.append({k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in metrics.items()})
    return steps


def check_losses_finite(log_text: str, *, min_steps: int) -> str:
    steps = train_step_metrics(log_text)
    if len(steps) < min_steps:
        raise CheckFailed(f"{len(steps)} training steps logged, expected at least {min_steps}")
    for n, metrics in enumerate(steps):
        for key, value in metrics.items():
            if key.startswith("train/") and isinstance(value, float) and not math.isfinite(value):
                raise CheckFailed(f"training step {n}: {key} = {value}")
    losses = [m.get("train/loss", m.get("train/pg_loss")) for m in steps]
    return f"{len(steps)} steps, losses finite ({', '.join(f'{x:.3g}' for x in losses if x is not None)})"


def check_resume(first: dict[int, list[dict]], resumed: dict[int, list[dict]], *, saved_step: int) -> str:
    """The resumed run starts at the rollout after the saved one (its depth is checked by :func:`check_depths`
    on its own dumps) and plays no rollout the first run had already trained before the save."""
    if not resumed:
        raise CheckFailed("the resumed run wrote no rollout dumps")
    start = min(resumed)
    if start != saved_step + 1:
        raise CheckFailed(f"the resumed run started at rollout {start}, the checkpoint was saved at {saved_step}")
    return f"resumed at rollout {start} after the checkpoint of rollout {saved_step}"
