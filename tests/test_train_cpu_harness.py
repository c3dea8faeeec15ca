"""train_cpu.py's own logic (tools/slime_pr/): arguments, the SLIME_DIR-unchanged digest, the shims' guards and
the packed-sequence attention shim. The cases themselves run slime's train.py for minutes: benchmarks/ and
verify.sh's opt-in step run them, not this suite."""

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools/slime_pr/cpu_shims"))

from slime_cpu_shims import guard, hooks  # noqa: E402
from slime_cpu_shims.megatron import packed_causal_attention  # noqa: E402

from tools.slime_pr import train_cpu  # noqa: E402


def _slime_tree(root: Path) -> Path:
    (root / "slime/utils").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "slime/utils/arguments.py").write_text("")
    return root


def test_parse_args_takes_a_slime_tree_and_a_case(tmp_path):
    tree = _slime_tree(tmp_path / "slime")
    args = train_cpu.parse_args([str(tree), "--case", "pristine-grpo", "--out", str(tmp_path / "o")])
    assert args.slime_dir == tree.resolve() and args.case == "pristine-grpo" and args.out == (tmp_path / "o").resolve()


@pytest.mark.parametrize("argv", [["--case", "nope"], ["--case", "pristine-grpo", "--out", "{tree}/out"]])
def test_parse_args_refuses_unknown_case_and_out_inside_the_tree(tmp_path, argv):
    tree = _slime_tree(tmp_path / "slime")
    with pytest.raises(SystemExit):
        train_cpu.parse_args([str(tree), *[a.format(tree=tree) for a in argv]])


def test_parse_args_refuses_a_folder_that_is_not_slime(tmp_path):
    with pytest.raises(SystemExit):
        train_cpu.parse_args([str(tmp_path), "--case", "pristine-grpo"])


def test_tree_digest_sees_content_new_caches_and_modes_but_not_git(tmp_path):
    tree = _slime_tree(tmp_path / "slime")
    (tree / ".git").mkdir()
    base = train_cpu.tree_digest(tree)
    (tree / ".git/index").write_text("x")
    assert train_cpu.tree_digest(tree) == base
    (tree / "slime/__pycache__").mkdir()
    assert train_cpu.tree_digest(tree) != base  # an empty cache folder written by a run counts
    (tree / "slime/__pycache__").rmdir()
    (tree / "train.py").write_text("print('changed')\n")
    assert train_cpu.tree_digest(tree) != base
    (tree / "train.py").write_text("print('train')\n")
    assert train_cpu.tree_digest(tree) == base
    (tree / "train.py").chmod(0o755)
    assert train_cpu.tree_digest(tree) != base


def _target(x):
    return x + 1


def _moved_target(x):
    return x + 2


def test_a_shim_refuses_a_target_whose_source_moved():
    digest = guard.source_digest(_target)
    guard.expect_source(_target, digest, "demo")
    with pytest.raises(guard.ShimTargetMoved, match="demo"):
        guard.expect_source(_moved_target, digest, "demo")
    with pytest.raises(guard.ShimTargetMoved):
        guard.expect_signature(_target, ["y"], "demo")


def test_post_import_hook_runs_once_after_the_module_executes(tmp_path, monkeypatch):
    (tmp_path / "h4_hooked_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hooks.when_imported("h4_hooked_mod", lambda m: seen.append(m.VALUE))
    import h4_hooked_mod  # noqa: F401

    assert seen == [1]
    hooks.when_imported("h4_hooked_mod", lambda m: seen.append(2))  # already imported: at once
    assert seen == [1, 2]


def _reference_attention(q, k, v, scale):
    s = q.size(0)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(s, -1)


def test_packed_attention_is_causal_attention_inside_each_sequence_only():
    torch.manual_seed(0)
    lens = [3, 5, 2]
    t, heads, groups, dim = sum(lens) + 2, 4, 2, 8  # 2 tokens of alignment padding after the last sequence
    q, k, v = torch.randn(t, heads, dim), torch.randn(t, groups, dim), torch.randn(t, groups, dim)
    cu = torch.tensor([0, 3, 8, 10])
    out = packed_causal_attention(q, k, v, cu, scale=dim**-0.5)
    assert out.shape == (t, heads * dim)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = _reference_attention(q[a:b], kk[a:b], vv[a:b], dim**-0.5)
        torch.testing.assert_close(out[a:b], ref)
    # a change in sequence 0 leaves sequences 1 and 2 alone
    k2 = k.clone()
    k2[0] += 10
    out2 = packed_causal_attention(q, k2, v, cu, scale=dim**-0.5)
    torch.testing.assert_close(out2[3:], out[3:])
    assert not torch.allclose(out2[:3], out[:3])


def test_parse_steps_reads_slime_step_lines():
    text = "junk\n(pid=1) [2026] model.py:918 - step 3: {'train/loss': 0.5, 'train/grad_norm': 1.25}\n"
    (step,) = train_cpu.parse_steps(text)
    assert step == {"train/loss": 0.5, "train/grad_norm": 1.25, "_step": 3}


def test_a_case_not_ok_ends_in_one_failed_line_and_exit_1(tmp_path, capsys, monkeypatch):
    tree = _slime_tree(tmp_path / "slime")

    def boom(args, env):
        raise train_cpu.CaseFailed("no steps")

    monkeypatch.setitem(train_cpu.CASE_FUNCS, "pristine-grpo", boom)
    monkeypatch.setattr(train_cpu, "harness_env", lambda args: {})
    rc = train_cpu.main([str(tree), "--case", "pristine-grpo", "--out", str(tmp_path / "o")])
    assert rc == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "train_cpu pristine-grpo: FAILED: no steps"


def test_a_run_that_writes_into_the_tree_fails(tmp_path, capsys, monkeypatch):
    tree = _slime_tree(tmp_path / "slime")

    def writes(args, env):
        (tree / "slime/leftover.pyc").write_bytes(b"x")
        return "fine"

    monkeypatch.setitem(train_cpu.CASE_FUNCS, "pristine-grpo", writes)
    monkeypatch.setattr(train_cpu, "harness_env", lambda args: {})
    assert train_cpu.main([str(tree), "--case", "pristine-grpo", "--out", str(tmp_path / "o")]) == 1
    assert "changed during the run" in capsys.readouterr().out


def test_cpu_torch_sends_cuda_literals_to_the_cpu_and_drops_pinning_only():
    from slime_cpu_shims.cpu_torch import CpuTorch

    t = CpuTorch(torch)
    assert t.zeros(2, device="cuda").device.type == "cpu"
    assert t.tensor([1], device="cuda:1").device.type == "cpu"
    assert t.empty_like(torch.ones(2), pin_memory=True).shape == (2,)
    assert t.device("cuda") == torch.device("cpu") and t.device("meta") == torch.device("meta")
    assert t.float32 is torch.float32 and t.nn is torch.nn


def _ppo_sample(coef, kl, reward=1.0):
    """Returns of a PPO sample with gamma = lambd = 1: the sum of the rewards from each token on."""
    rewards = [-coef * k for k in kl]
    rewards[-1] += reward
    returns = [sum(rewards[t:]) for t in range(len(rewards))]
    return {"kl": kl, "returns": returns, "mask": [1.0] * len(kl)}


def _kl_records(coefs, observed, kl_coef, shaped_with=None):
    """Two ranks' trace of len(coefs) - 1 controller steps."""
    recs = []
    for k in range(len(coefs) - 1):
        used = coefs[k] if shaped_with is None else shaped_with
        recs.append({"event": "advantages", "samples": [_ppo_sample(used, [0.3, 0.1, 0.2, 0.5])]})
        recs.append({"event": "step", "before": coefs[k], "after": coefs[k + 1], "observed_kl": observed[k],
                     "target": 0.01})
    return {0: [dict(r) for r in recs], 1: [dict(r) for r in recs]}


def test_kl_fit_recovers_the_coefficient_that_shaped_the_returns():
    from tools.slime_pr.train_cpu_kl import fitted_coef

    assert fitted_coef([_ppo_sample(0.0437, [0.3, 0.1, 0.2, 0.5]), _ppo_sample(0.0437, [1.0, 0.0])]) == \
        pytest.approx(0.0437, rel=1e-9)
    assert fitted_coef([_ppo_sample(0.05, [0.0, 0.0, 0.0])]) is None


def test_kl_checks_pass_a_controller_run_and_catch_kl_coef_used_instead():
    from tools.slime_pr import train_cpu_kl as K

    coefs = [0.05, 0.055, 0.0605, 0.06655]  # observed KL above target: the coefficient grows
    K.check_run(_kl_records(coefs, [0.5, 0.5, 0.5], 0.05), 0.05, 0.05, "run")
    with pytest.raises(K.KLCheckFailed, match="shaped with coefficient 0.05"):
        K.check_run(_kl_records(coefs, [0.5, 0.5, 0.5], 0.05, shaped_with=0.05), 0.05, 0.05, "run")
    with pytest.raises(K.KLCheckFailed, match="sign of the error"):
        K.check_run(_kl_records(coefs, [0.5, 0.001, 0.5], 0.05), 0.05, 0.05, "run")
    recs = _kl_records(coefs, [0.5, 0.5, 0.5], 0.05)
    recs[1][-1]["after"] = 0.07
    with pytest.raises(K.KLCheckFailed, match="differs across ranks"):
        K.check_run(recs, 0.05, 0.05, "run")


def test_a_failed_train_run_is_named_in_one_line_with_its_last_error(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("start\nTraceback (most recent call last):\n  File x\nKeyError: 'output_layer.bias'\nbye\n")
    run = train_cpu.Run("grpo", [], log, rc=1, seconds=12.0)
    with pytest.raises(train_cpu.CaseFailed) as exc:
        train_cpu.require_ok(run)
    assert "\n" not in str(exc.value) and "KeyError: 'output_layer.bias'" in str(exc.value)
    assert exc.value.detail.endswith("bye")
