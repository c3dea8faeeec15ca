"""train.py's parser: one-line errors, no abbreviations, one default per flag in ``--help``.

argparse prints a usage block of 120 lines above a parse error, which buries the one line that matters;
it also accepts any unique prefix of a flag (``--save-int`` for ``--save-interval``), so a typo can pick
another flag. Upstream slime's parsers set ``allow_abbrev=False``; so does this one.
"""

from __future__ import annotations

import argparse
import difflib
import re

from slime.arguments.unsupported_flags import ABSENT, absent_flags, one_line, refused_flags

# Help text that already says what the flag defaults to ("default: --lr", "Default is 1", "off by default").
_STATES_DEFAULT = re.compile(r"\bdefault\b", re.IGNORECASE)


class OneDefaultHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` only where the help text does not state the default in words.

    Where it does, argparse's raw value (often ``None``) would contradict it: "(default: --lr) (default: None)".
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if _STATES_DEFAULT.search(text.replace("%(default)s", "")):
            return text
        return super()._get_help_string(action)


class LaunchParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``PROG: error: MESSAGE``, exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", OneDefaultHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        absent = absent_flags(extras)
        if absent:
            # slime flags this runtime lacks: each with its answer, with any refused ones, in one line.
            others = [w for w in extras if w.startswith("--") and not any(a.startswith(w.split("=", 1)[0] + " ")
                                                                          for a in absent)]
            rest = f"; unrecognized arguments: {' '.join(others)}{self._suggestion(others)}" if others else ""
            self.error(one_line(absent + refused_flags(namespace)) + rest)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggestion(extras)}")
        return namespace

    def _suggestion(self, extras) -> str:
        """What an unknown ``--x`` may have meant: the flags it abbreviates, else the closest spelling."""
        options = [opt for action in self._actions for opt in action.option_strings if opt.startswith("--")]
        hints = []
        for word in extras:
            name = word.split("=", 1)[0]
            if not name.startswith("--"):
                continue
            longer = sorted(opt for opt in options if opt.startswith(name))
            if longer:
                hints.append(f"{name} is short for {' or '.join(longer[:3])}: flags are not abbreviated, "
                             "spell it out")
            elif close := difflib.get_close_matches(name, options + list(ABSENT), n=1):
                # A near miss of a slime flag this runtime lacks gets that flag's answer, not a random neighbour.
                answer = f" (a slime flag not implemented here: {ABSENT[close[0]]})" if close[0] in ABSENT else ""
                hints.append(f"{name}: did you mean {close[0]}?{answer}")
        return f" ({'; '.join(hints)})" if hints else ""
