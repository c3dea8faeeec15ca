"""Pure OPD learns: a student distilled on its own samples moves toward a trained tiny teacher.

Task: map a letter to its mirror in the alphabet (``a`` -> ``z``, ``b`` -> ``y``, ...), answer then
``<|im_end|>``. The teacher is a tiny Qwen3 fitted to the task by a few seconds of supervised training
(it answers correctly with probability ~0.97). The student is another initialisation given a short
stretch of the same training, so it leans toward the right answers but spreads most of its mass
elsewhere. train.py then runs pure OPD (no task reward: ``--rm-type`` is unset, so only the teacher's
per-token reverse KL moves the policy) with the teacher in the trainer.

Measured exactly, with teacher forcing on every prompt (no sampling noise):
- agreement: the probability that the student samples the teacher's answer. The teacher's answer is
  the label, so this is also the student's expected exact-match task reward at temperature 1.
- the reverse KL KL(student || teacher) of the first answer token, over the whole vocabulary.

Why these settings: with 100 token choices and a flat student, the sampled estimator is noisy, so each
step uses 32 samples per prompt; at lr 1e-3 the gain in 20 steps is small, at 3e-3 it is clear. A
plain-PyTorch check of the same update gave the same picture over two seeds. The greedy answer is not
asserted: the student's top two tokens are nearly tied, so one of eight can flip either way.
"""

import json
import string

import pytest
import torch

import train
from slime.utils.metrics import read_metrics
from slime.utils.tiny_models import build_tiny_model, build_tokenizer, save_tiny_checkpoint

LETTERS = string.ascii_lowercase[:8]
STEPS, SAMPLES_PER_PROMPT = 20, 32


def mirror(letter: str) -> str:
    return string.ascii_lowercase[25 - string.ascii_lowercase.index(letter)]


class MirrorTask:
    """Prompt/answer token tensors of every letter, padded to one length (the template is fixed-size)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                                 add_generation_prompt=True) for c in LETTERS]
        prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        assert len({len(p) for p in prompt_ids}) == 1
        self.prompt_len = len(prompt_ids[0])
        answers = [tokenizer.encode(mirror(c), add_special_tokens=False) + [tokenizer.eos_token_id]
                   for c in LETTERS]
        self.ids = torch.tensor([p + a for p, a in zip(prompt_ids, answers)])
        # Next-token targets: only the answer tokens are supervised.
        self.targets = torch.full_like(self.ids, -100)
        self.targets[:, self.prompt_len - 1:-1] = self.ids[:, self.prompt_len:]

    def fit(self, seed: int, steps: int):
        """A tiny model trained ``steps`` full-batch Adam steps on the task (a few seconds on a CPU)."""
        model = build_tiny_model(self.tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=seed).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(steps):
            logits = model(self.ids).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.targets.flatten(), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.eval()

    @torch.no_grad()
    def answer_log_probs(self, model) -> torch.Tensor:
        """``[letters, answer_len, vocab]`` log-probs at the answer positions under teacher forcing."""
        logits = model(self.ids).logits[:, self.prompt_len - 1:-1]
        return torch.log_softmax(logits.float(), dim=-1)

    def agreement(self, model) -> float:
        """Mean probability that ``model`` samples exactly the right answer (letter, then end of turn)."""
        log_probs = self.answer_log_probs(model)
        answer = self.ids[:, self.prompt_len:]
        return float(log_probs.gather(-1, answer.unsqueeze(-1)).squeeze(-1).sum(-1).exp().mean())

    def first_token_reverse_kl(self, model, teacher) -> float:
        student_lp = self.answer_log_probs(model)[:, 0]
        teacher_lp = self.answer_log_probs(teacher)[:, 0]
        return float((student_lp.exp() * (student_lp - teacher_lp)).sum(-1).mean())


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("opd_learning")
    tokenizer = build_tokenizer()
    task = MirrorTask(tokenizer)
    teacher = task.fit(seed=0, steps=150)
    student = task.fit(seed=1, steps=25)
    save_tiny_checkpoint(root / "teacher", model=teacher, tokenizer=tokenizer)
    save_tiny_checkpoint(root / "student", model=student, tokenizer=tokenizer)
    data = root / "mirror.jsonl"
    data.write_text("".join(json.dumps({"input": c, "label": mirror(c)}) + "\n" for c in LETTERS))
    n = len(LETTERS) * SAMPLES_PER_PROMPT
    argv = ["--hf-checkpoint", str(root / "student"), "--prompt-data", str(data), "--apply-chat-template",
            "--label-key", "label", "--rollout-batch-size", str(len(LETTERS)),
            "--n-samples-per-prompt", str(SAMPLES_PER_PROMPT), "--global-batch-size", str(n),
            "--micro-batch-size", "64", "--num-rollout", str(STEPS), "--rollout-max-response-len", "4",
            "--rollout-temperature", "1.0", "--rollout-seed", "3", "--lr", "3e-3",
            "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(root / "teacher"),
            "--save", str(root / "run"), "--save-interval", str(STEPS)]
    try:
        assert train.main(argv) == 0
    finally:
        import ray

        ray.shutdown()
    final = root / "run" / f"iter_{STEPS - 1:07d}" / "model" / "hf"
    return {"task": task, "teacher": teacher, "student": student,
            "trained": AutoModelForCausalLM.from_pretrained(final).eval(),
            "metrics": read_metrics(root / "run" / "metrics.jsonl")}


def test_teacher_is_competent_and_student_is_not(distilled):
    task = distilled["task"]
    assert task.agreement(distilled["teacher"]) > 0.9
    assert task.agreement(distilled["student"]) < 0.2


def test_pure_opd_raises_agreement_and_expected_task_reward(distilled):
    # Observed: 0.061 -> 0.278 (4.5x) in 20 steps.
    task = distilled["task"]
    before, after = task.agreement(distilled["student"]), task.agreement(distilled["trained"])
    assert after > 2 * before, (before, after)


def test_pure_opd_lowers_the_exact_reverse_kl_to_the_teacher(distilled):
    # Observed: 2.84 -> 2.12 nats on the first answer token.
    task, teacher = distilled["task"], distilled["teacher"]
    before = task.first_token_reverse_kl(distilled["student"], teacher)
    after = task.first_token_reverse_kl(distilled["trained"], teacher)
    assert after < before - 0.3, (before, after)


def test_run_metrics_show_pure_distillation(distilled):
    records = distilled["metrics"]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(r["rollout/reward"] == 0.0 for r in records)  # no task reward: the teacher alone teaches
    kl = [r["opd/reverse_kl"] for r in records]
    # Observed: 2.39 over the first five steps, 1.27 over the last five.
    assert sum(kl[-5:]) < 0.75 * sum(kl[:5]), kl
