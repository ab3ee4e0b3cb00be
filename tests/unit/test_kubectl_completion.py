"""``kubectl bucketnotify <TAB>``: kubectl runs ``kubectl_complete-bucketnotify`` with the words
typed so far and reads one candidate a line, then ``:<directive>``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bucketnotify.cli import build_parser
from bucketnotify.completion import candidates

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([""], {"topic", "notification", "completion", "operator", "delivery", "import"}),
        (["to"], {"topic"}),
        (["topic", ""], {"list", "stats", "dump"}),
        (["topic", "list", "--"], {"--namespace", "--all-namespaces"}),
        (["completion", ""], {"bash", "zsh"}),
        (["operator", "--log-level", ""], {"DEBUG", "INFO", "WARNING", "ERROR"}),
        (["operator", "--log-level", "W"], {"WARNING"}),
        (["operator", "--log-level=INFO", "--log-f"], {"--log-format"}),
    ],
)
def test_the_candidates_are_what_may_follow_the_words(words: list[str], expected: set[str]) -> None:
    found = set(candidates(build_parser(), words))
    assert expected <= found, found
    assert all(c.startswith(words[-1]) for c in found)


def test_kubectl_reads_the_candidates_and_a_directive_from_the_installed_script() -> None:
    done = subprocess.run(
        [str(BIN / "kubectl_complete-bucketnotify"), "completion", "z"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == ["zsh", ":4"]
