"""Validation of the ``--tcod-*`` flags in ``slime_validate_args`` (CPU)."""

import pytest
from test_megatron_argument_validation import load_slime_arguments_module, make_slime_validate_args

NUM_GPUS = 0
HOOK = "slime.rollout.tcod.check_episode_planned"
pytestmark = pytest.mark.unit


@pytest.fixture
def validate(monkeypatch):
    """``validate(**overrides)``: valid TCOD args (OPD with an SGLang teacher and a generate function that plays
    the curriculum) with the overrides, after ``slime_validate_args``."""
    module = load_slime_arguments_module(monkeypatch)

    def validate(**overrides):
        values = dict(
            use_opd=True,
            opd_type="sglang",
            custom_generate_function_path="examples.multi_turn_tcod.rollout.generate",
            rollout_sample_hook_path=["my.hook"],
            use_tcod=True,
            tcod_mode=None,
            tcod_k_start=None,
            tcod_eta=2,
            tcod_k_max=None,
        )
        args = make_slime_validate_args(**{**values, **overrides})
        module.slime_validate_args(args)
        return args

    return validate


def tcod_values(args):
    return args.tcod_mode, args.tcod_k_start, args.tcod_eta, args.tcod_k_max


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (dict(), ("f2b", 1, 2, None)),  # the defaults; k_max unset: the generate function's max_turns
        (dict(tcod_mode="b2f", tcod_k_start=2, tcod_k_max=5), ("b2f", 2, 2, 5)),
    ],
)
def test_tcod_values_after_validation(validate, overrides, expected):
    args = validate(**overrides)

    assert tcod_values(args) == expected
    # The hook that fails the first rollout step if the generate function never planned an episode.
    assert args.rollout_sample_hook_path == ["my.hook", HOOK]
    assert not hasattr(args, "max_turns")  # no example's YAML key is read


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(use_opd=False, opd_type=None), "--use-tcod requires --use-opd"),
        (dict(custom_generate_function_path=None), "--use-tcod requires a multi-turn --custom-generate-function-path"),
        (dict(tcod_eta=None), "--tcod-eta must be specified"),
        (dict(tcod_eta=0), "--tcod-eta must be specified"),
        (dict(tcod_k_start=0), r"1 <= --tcod-k-start \(0\)"),
        (dict(tcod_k_start=4, tcod_k_max=3), r"--tcod-k-start \(4\) <= --tcod-k-max \(3\)"),
        # Without --use-tcod every other --tcod-* flag is refused.
        (dict(use_tcod=False, tcod_eta=None, tcod_mode="b2f"), "--tcod-mode is set but --use-tcod is not enabled"),
        (dict(use_tcod=False, tcod_eta=None, tcod_k_start=1), "--tcod-k-start is set but --use-tcod"),
        (dict(use_tcod=False), "--tcod-eta is set but --use-tcod is not enabled"),
        (dict(use_tcod=False, tcod_eta=None, tcod_k_max=4), "--tcod-k-max is set but --use-tcod"),
    ],
)
def test_tcod_rejects_invalid_settings(validate, overrides, match):
    with pytest.raises(ValueError, match=match):
        validate(**overrides)


def test_without_use_tcod_nothing_is_set_or_added(validate):
    args = validate(use_tcod=False, tcod_eta=None)

    assert tcod_values(args) == (None,) * 4
    assert args.rollout_sample_hook_path == ["my.hook"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
