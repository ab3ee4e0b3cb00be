"""docs/operator.md's "Fault bounds" table says the numbers the fault tests assert: the same
numbers, read from tests/faults/bounds.py, or this fails."""

from __future__ import annotations

import re
from pathlib import Path

from tests.faults import bounds

DOC = Path(__file__).parents[2] / "docs" / "operator.md"


def documented_bounds() -> dict[str, float]:
    """Constant → value of each row of the "Fault bounds" table."""
    section = DOC.read_text().split("\n## Fault bounds\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.fullmatch(r"\|.*\| `([A-Z0-9_]+)` \| ([0-9.]+)( s)? \|", line)
        if found:
            rows[found[1]] = float(found[2])
    return rows


def test_every_bound_in_the_docs_is_the_one_the_fault_tests_assert() -> None:
    documented = documented_bounds()
    assert documented, "no bound found in the Fault bounds table of docs/operator.md"
    for name, value in documented.items():
        assert hasattr(bounds, name), f"docs/operator.md names {name}, which no test uses"
        assert getattr(bounds, name) == value, (
            f"docs/operator.md says {name} is {value}; the fault tests use {getattr(bounds, name)}"
        )


def test_every_bound_the_fault_tests_assert_is_in_the_docs() -> None:
    asserted = {
        name for name in vars(bounds) if name.isupper() and name not in {"PER_SECOND", "PROGRESS_S"}
    }
    assert asserted - set(documented_bounds()) == set(), "bounds the docs do not state"


def test_the_docs_prose_quotes_the_same_numbers() -> None:
    text = DOC.read_text()
    # The paragraphs that explain the bounds quote them; a changed bound must change them.
    assert f"at most {bounds.KILL_REPEAT_WINDOW_S:g} s before a kill" in text
    assert f"at most {bounds.REPEATS_PER_KILL} per kill" in text
    assert f"at most {bounds.REPEATS_PER_1000} per 1,000 events" in text
    assert f"written at most {bounds.RABBITMQ_CONFIRM_WINDOW_S:g} s before the broker" in text
    assert f"until {bounds.LATE_COPY_SWEEP_S:g} s after the fault ended" in text
    assert f"write {bounds.PER_SECOND} objects a second" in text
