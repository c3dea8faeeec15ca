"""--custom-config-path values take the type of the flag they set, or are refused before Ray naming the key and
the type; a key that overrides a flag given on the command line is named with both values (the YAML wins).

Everything goes through train.py's own parser (``parse_args``), on real files: PyYAML reads ``1e-3`` as a
string, which passed ``--dry-run`` and crashed the optimizer after Ray had started.
"""

import pytest

import train
from slime.utils.arguments import parse_args
from slime.utils.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(save_tiny_checkpoint(tmp_path_factory.mktemp("yaml") / "model", hidden_size=16, num_layers=1,
                                    num_heads=2))


def parse(model, tmp_path, yaml_text, *extra):
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text)
    return parse_args(argv=["--hf-checkpoint", model, "--num-rollout", "1", "--custom-config-path", str(config),
                            "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", model, *extra])


def test_values_take_their_flags_types(model, tmp_path):
    args = parse(model, tmp_path, "lr: 1e-3\nmax_turns: 4\nenv_step_timeout: 30\nuse_tcod: true\ntcod_mode: f2b\n"
                 "tcod_k_start: 1\ntcod_eta: 3\neval_prompt_data: [a, b.jsonl]\nrollout_interaction_env_path: examples.agent_envs\n"
                 "my_plugin_key: 1e-3\n")
    assert args.lr == 0.001 and isinstance(args.lr, float)
    assert args.max_turns == 4 and isinstance(args.env_step_timeout, float) and args.use_tcod is True
    assert args.eval_prompt_data == ["a", "b.jsonl"]
    assert args.my_plugin_key == "1e-3"  # no flag of that name: set as PyYAML read it (a plugin reads its own)


@pytest.mark.parametrize("line,message", [
    ("lr: fast", "key 'lr' = 'fast' (for --lr) must be a number"),
    ("max_turns: 2.5", "key 'max_turns' = 2.5 (for --max-turns) must be an integer"),
    ("use_tcod: 'yes'", "key 'use_tcod' = 'yes' (for --use-tcod) must be true or false"),
    ("tcod_mode: sideways", "key 'tcod_mode' = 'sideways' (for --tcod-mode) must be one of f2b, b2f"),
])
def test_a_value_that_is_not_of_its_flags_type_is_refused_in_one_line(model, tmp_path, capsys, line, message):
    with pytest.raises(SystemExit) as exit_:
        parse(model, tmp_path, line + "\n")
    assert exit_.value.code == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err.split(": ", 1)[1] == f"error: --custom-config-path {tmp_path / 'config.yaml'}: {message}", err


def test_a_key_that_overrides_a_flag_given_on_the_command_line_is_named_with_both_values(model, tmp_path, capsys):
    args = parse(model, tmp_path, "tcod_eta: 2\nlr: 1e-3\nmax_turns: 3\n", "--rollout-interaction-env-path",
                 "examples.agent_envs", "--use-tcod", "--tcod-mode", "f2b", "--tcod-k-start",
                 "1", "--tcod-eta", "1", "--lr", "0.001")
    assert args.tcod_eta == 2  # upstream's rule: the YAML wins
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": ", 1)[1] for line in err] == [f"warning: --custom-config-path {tmp_path / 'config.yaml'}: tcod_eta: 2 overrides "
                   "--tcod-eta 1 given on the command line (the YAML wins, as in slime)"]  # lr: the same value


def test_the_dry_run_refuses_it_before_anything_starts(model, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("lr: fast\n")
    with pytest.raises(SystemExit):
        train.main(["--hf-checkpoint", model, "--num-rollout", "1", "--custom-config-path", str(config), "--dry-run"])
    assert "must be a number" in capsys.readouterr().err


@pytest.mark.parametrize("text,where", [
    ("lr: 1e-3\nmax_turns: [3\nuse_tcod: true\n", "line 3 column 9: not valid YAML: expected ',' or ']', but got ':' "
     "(while parsing a flow sequence from line 2)"),
    ("lr: 1e-3\n  max_turns: 3\n", "line 2 column 12: not valid YAML: mapping values are not allowed here"),
])
def test_malformed_yaml_is_refused_naming_its_line(model, tmp_path, capsys, text, where):
    with pytest.raises(SystemExit) as exit_:
        parse(model, tmp_path, text)
    assert exit_.value.code == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err.split(": ", 1)[1] == f"error: --custom-config-path {tmp_path / 'config.yaml'} {where}", err
