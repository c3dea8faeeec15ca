"""``--custom-config-path`` keys: typed as their flags, overrides named, near misses warned about.

Upstream applies every YAML key onto ``args``, so a misspelled ``max_turn_respone_len`` is set, read by
nobody, and the run uses the flag's default. Unknown keys stay allowed (a plugin may read its own); only
a near miss of a known key is warned about. A key that names a flag takes the flag's type (``typed_value``:
PyYAML reads ``1e-3`` as a string, which would crash the optimizer after Ray started) or is refused; one
that overrides a flag given on the command line is named with both values (upstream's rule, YAML wins, stays).
"""

from __future__ import annotations

import difflib

# Keys the shipped code reads from args that are no flag of this runtime (upstream slime's flags).
CONSUMER_KEYS = frozenset({
    "ci_test",  # examples/multi_turn_tcod/metrics.py
    "moe_router_topk",  # slime/utils/types.py (routed experts)
    "use_rollout_routing_replay",  # examples/multi_turn_tcod/rollout.py
})
CLOSE_MATCH_CUTOFF = 0.85


def _one_edit_apart(a: str, b: str) -> bool:
    """One insertion, deletion, substitution or swap of neighbours turns ``a`` into ``b``."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])
    short, long_ = sorted((a, b), key=len)
    i = next((k for k in range(len(short)) if short[k] != long_[k]), len(short))
    return short[i:] == long_[i + 1:]


def nearest_key(key: str, known) -> str | None:
    close = sorted(k for k in known if _one_edit_apart(key, k))
    if close:
        return close[0]
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=CLOSE_MATCH_CUTOFF)
    return match[0] if match else None


def known_keys(args, yaml_keys) -> set[str]:
    """Flag dests (this parser's, and custom flags: attributes of args the YAML did not set) + consumers'."""
    from slime.utils.arguments import get_parser

    dests = {action.dest for action in get_parser()._actions}
    return dests | CONSUMER_KEYS | (set(vars(args)) - set(yaml_keys))


def config_key_warnings(args) -> list[str]:
    path = getattr(args, "custom_config_path", None)
    if not path:
        return []
    import yaml

    with open(path, encoding="utf-8") as handle:  # validate_args has read and applied it already
        data = yaml.safe_load(handle) or {}
    keys = [str(key).replace("-", "_") for key in data]
    known = known_keys(args, keys)
    notes = []
    for key in keys:
        if key not in known and (meant := nearest_key(key, known)):
            notes.append(f"warning: --custom-config-path key {key!r} is read by nothing; did you mean {meant!r}?")
    return notes


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
