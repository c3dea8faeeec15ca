"""``--custom-config-path``: upstream's YAML of argument names, applied onto ``args`` before validation.

Upstream applies every key with ``setattr``, so YAML's ``1e-3`` (a string to PyYAML) would reach the
optimizer as text and fail after Ray started. Here a key that names a flag takes that flag's type
(``typed_value``: as the command line would give it) or is refused naming key, value and type, and a key
that overrides a flag typed on the command line is named with both values (upstream's rule, YAML wins,
stays). Keys that name no flag are set as they are: a plugin may read its own. Which of those look like a
misspelled flag is the launch checks' business (``slime.launch.config_keys``).
"""

from __future__ import annotations

from pathlib import Path

from slime.arguments.argument_error import fail as _fail


def apply_custom_config(args, parser=None, argv=None) -> list[str]:
    """Set every key of the ``--custom-config-path`` YAML on ``args`` (upstream's semantics); returns one line
    per flag given on the command line that a key overrides.

    With the ``parser`` (``parse_args`` passes it), a key that names a flag takes that flag's type or is
    refused, and ``argv`` tells which flags the user typed. Applied once: validation calls it again."""
    if not args.custom_config_path or getattr(args, "_custom_config_applied", False):
        return []
    import yaml

    path = Path(args.custom_config_path)
    if not path.is_file():
        _fail(f"--custom-config-path {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        _fail(f"--custom-config-path {yaml_error_where(path, err)}")
    if not isinstance(data, dict):
        _fail(f"--custom-config-path {path}: the YAML must be a mapping of argument names to values")
    actions = flag_actions(parser) if parser is not None else {}
    given = given_on_command_line(parser, argv) if parser is not None else {}
    overrides = []
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in actions:
            try:
                value = typed_value(actions[name], value, str(key))
            except ValueError as err:
                _fail(f"--custom-config-path {path}: {err}")
        if name in given and getattr(args, name, None) != value:
            overrides.append(f"--custom-config-path {path}: {key}: {value!r} overrides {given[name]} "
                             f"{getattr(args, name)!r} given on the command line (the YAML wins, as in slime)")
        setattr(args, name, value)
    args._custom_config_applied = parser is not None
    return overrides


def flag_actions(parser) -> dict:
    """``dest -> argparse action`` for every flag of ``parser`` (the first action of a dest wins)."""
    actions = {}
    for action in parser._actions:
        if action.option_strings:
            actions.setdefault(action.dest, action)
    return actions


def given_on_command_line(parser, argv) -> dict:
    """``dest -> the option string the user typed`` for the flags in ``argv``."""
    by_option = {opt: action.dest for action in parser._actions for opt in action.option_strings}
    given = {}
    for token in argv:
        option = token.split("=", 1)[0]
        if option in by_option:
            given.setdefault(by_option[option], option)
    return given


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}


def _one(action, value, where: str):
    """``value`` as the flag's own parser would make it from the command line, or ``ValueError``."""
    kind = action.type or str
    if kind in _TYPE_NAMES:
        if isinstance(value, bool) or isinstance(value, (list, dict)) or (kind is int and isinstance(value, float)
                                                                          and not value.is_integer()):
            raise ValueError(f"{where} must be {_TYPE_NAMES[kind]}")
        try:
            value = kind(value)  # YAML's 1e-3 is a string, its 2 an int: each as the command line would give it
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be {_TYPE_NAMES[kind]}") from None
    elif isinstance(value, str):  # a converter of its own (json.loads, a parser function): it reads text
        try:
            value = kind(value)
        except Exception as err:  # noqa: BLE001 - any converter's refusal is the user's input
            raise ValueError(f"{where} is not accepted by the flag's parser: {err}") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where} must be one of {', '.join(map(str, action.choices))}")
    return value


def typed_value(action, value, key: str):
    """A ``--custom-config-path`` value in the type of the flag it sets, or ``ValueError`` naming both."""
    flag = action.option_strings[-1]
    where = f"key {key!r} = {value!r} (for {flag})"
    if value is None:
        return None  # as a flag whose default is None
    if action.nargs == 0:  # store_true / store_false
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false")
        return value
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = value if isinstance(value, list) else [value]
        return [_one(action, item, where) for item in items]
    return _one(action, value, where)


def yaml_error_where(path: Path, err) -> str:
    """``FILE line N column C: not valid YAML: PROBLEM`` (and where the construct it broke began), from
    PyYAML's marks (0-based) instead of its first line, which names no line."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        return f"{path}: not valid YAML ({problem})"
    text = f"{path} line {mark.line + 1} column {mark.column + 1}: not valid YAML: {problem}"
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and start is not None:
        text += f" ({context} from line {start.line + 1})"
    return text
