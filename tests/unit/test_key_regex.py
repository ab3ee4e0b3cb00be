"""The key regexes the operator lets through to the gateway (gateway/key_regex.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketnotify.gateway.key_regex import regex_problem

# Each of these was PUT as a notification's key regex on Ceph 16.2.15 and the next upload to
# the bucket aborted radosgw (uncaught std::regex_error). Python's re compiles the first four.
ABORT_THE_GATEWAY = [
    ("a{", "not followed by a count"),
    ("a{,3}", "not followed by a count"),
    ("(?>a)", "group kind"),
    ("\\N{LATIN SMALL LETTER A}", "the escape \\N"),
    ("([unclosed", "never closed"),
    ("a{2,1}", "maximum is below its minimum"),
    ("[\\w-z]", "a class such as \\d at one end"),
    ("^*a", "after an assertion"),
]

# Outside the grammar although some engine takes them: refused with what to write instead.
STRICTER = [
    ("]", "unescaped ']'"),
    ("}", "unescaped '}'"),
    ("a++", "quantifier on a quantifier"),
    ("a{1}{2}", "quantifier on a quantifier"),
    ("[[:alpha:]]+", "POSIX class"),
    ("\\e", "the escape \\e"),
    ("\\k<n>", "the escape \\k"),
    ("(?i)abc", "group kind"),
    ("(?P<n>a)", "group kind"),
    ("(?<=img/).*", "group kind"),
    ("(?#note)a", "group kind"),
    ("\\Aimg", "the escape \\A"),
    ("img\\Z", "the escape \\Z"),
    ("\\1(a)", "refers to no group"),
    ("(a\\1)", "refers to no group"),
    ("[z-a]", "out of order"),
    ("a)", "closes no group"),
    ("*a", "nothing to repeat"),
    ("\\x4", "2 hex digits"),
    ("\\u004", "4 hex digits"),
    ("ab\\", "at the end"),
    ("[ab", "never closed"),
    ("\\01", "the escape \\0"),
]

ACCEPTED = [
    "abc",
    "img/[0-9]+\\.jpg",
    "^photos/.*\\.(jpe?g|png)$",
    "(?:ab)+c",
    "(a|b)\\1x",
    "x{2,3}?y",
    "e{2}",
    "g{1,}",
    "[^a-c]z",
    "\\x41\\u0042",
    "(?=d)\\w+",
    "(?!c)\\w+",
    "\\d{3}-\\s?\\S",
    "a\\.b\\/c\\-d",
    "[\\d-]+",
    "a\\b",
    "\\Bx",
    "[\\cJ]?k",
    "[\\b]?b",
    "n\\0?",
    "f(o)*?",
    ".a.",
    "a|",
    "(?:)",
    "[a-\\u0062]c",
    "ключ/ü.*",
]


@pytest.mark.parametrize(("regex", "why"), ABORT_THE_GATEWAY + STRICTER)
def test_what_the_gateway_cannot_run_is_refused_with_the_reason(regex: str, why: str) -> None:
    problem = regex_problem(regex)
    assert problem is not None, regex
    assert problem.startswith("filter.key.regex is outside the gateway's regex dialect: ")
    assert why in problem, problem
    assert "at position " in problem


@pytest.mark.parametrize("regex", ACCEPTED)
def test_the_ecmascript_subset_is_accepted(regex: str) -> None:
    assert regex_problem(regex) is None


def test_the_position_points_at_the_fault() -> None:
    assert regex_problem("img/x{") == (
        "filter.key.regex is outside the gateway's regex dialect: '{' not followed by a count"
        " (write \\{ for the character) at position 5"
    )


@settings(max_examples=300)
@given(st.text(alphabet="ab()[]{}|^$\\.*+?:=!<-,0123dwxuc", max_size=20) | st.text(max_size=30))
def test_any_text_gets_an_answer_not_an_exception(regex: str) -> None:
    problem = regex_problem(regex)
    assert problem is None or problem.startswith("filter.key.regex is outside")
