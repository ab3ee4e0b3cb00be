"""``kubectl bucketnotify <TAB>``: the completions kubectl asks a plugin for.

kubectl (1.26 and later) completes a plugin's words by running ``kubectl_complete-<plugin>``
from ``PATH`` with the words typed so far, the last one being the word to complete (empty
after a space), and reads one candidate per line, then ``:<directive>`` (cobra's protocol:
4 = no file names). shtab writes completion scripts for bash and zsh but not this protocol,
so the candidates come from walking our own argparse parser here.
"""

from __future__ import annotations

import argparse
import sys

from bucketnotify.cli import build_parser

__all__ = ["candidates", "kubectl_complete"]

NO_FILE_COMPLETION = 4


def candidates(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """What may follow ``words[:-1]``, starting with ``words[-1]``: a subcommand, an
    option, or a value among an option's choices."""
    *done, partial = words or [""]
    current = parser
    expects: argparse.Action | None = None
    for word in done:
        if expects is not None:
            expects = None  # that word was the value of the option before it
            continue
        sub = _subcommands(current)
        if word in sub:
            current = sub[word]
            continue
        action = current._option_string_actions.get(word.split("=", 1)[0])
        if action is not None and action.nargs != 0 and "=" not in word:
            expects = action
    if expects is not None:
        found = [str(c) for c in expects.choices or ()]
    elif partial.startswith("-"):
        found = [o for o in current._option_string_actions if o.startswith("--")]
    else:
        found = list(_subcommands(current)) + [
            str(c)
            for a in current._actions
            if not a.option_strings and a.choices and not isinstance(a.choices, dict)
            for c in a.choices
        ]
    return sorted(c for c in set(found) if c.startswith(partial))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def kubectl_complete() -> int:
    for candidate in candidates(build_parser(), sys.argv[1:]):
        print(candidate)
    print(f":{NO_FILE_COMPLETION}")
    return 0
