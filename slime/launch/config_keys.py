"""``--custom-config-path`` keys that look like a misspelled flag: warned about before Ray.

Upstream applies every YAML key onto ``args``, so a misspelled ``max_turn_respone_len`` is set, read by
nobody, and the run uses the flag's default. Unknown keys stay allowed (a plugin may read its own); only
a near miss of a known key is warned about. Typing the values and naming overrides happens at parse time
(``slime.arguments.custom_config``).
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
