"""compact_json reads and writes what json does, faster where orjson agrees with it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketnotify import compact_json

# JSON values, integers well beyond 64 bits and every code point (lone surrogates too).
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**19, -(10**19), 10**25])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.from_regex(r"[0-9a-z.\\\"]{0,30}", fullmatch=True),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(values)
def test_reads_what_json_reads(value: Any) -> None:
    text = json.dumps(value)  # ASCII, surrogates escaped
    assert compact_json.loads(text.encode()) == json.loads(text)
    try:
        utf8 = json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return  # a lone surrogate has no UTF-8
    assert compact_json.loads(utf8) == json.loads(utf8.decode())


@given(values)
def test_writes_what_reads_back_the_same(value: Any) -> None:
    try:
        written = compact_json.dumps(value)
    except UnicodeEncodeError:
        assert "\\ud" in json.dumps(value)  # only lone surrogates are refused
        return
    assert json.loads(written) == value
    if not _numbers(value):
        # Floats may be spelled otherwise (1e-7 for 1e-07), the rest is byte for byte.
        assert written == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def test_a_float_may_be_spelled_otherwise_but_is_the_same_number() -> None:
    assert json.loads(compact_json.dumps([1e-07, 0.1, 1e16])) == [1e-07, 0.1, 1e16]


def test_integers_beyond_64_bits_keep_every_digit() -> None:
    # orjson would read this as 1.2345678901234567e+21.
    assert compact_json.loads(b'{"size": 1234567890123456789012}') == {
        "size": 1234567890123456789012
    }
    assert compact_json.dumps([2**70]) == b"[1180591620717411303424]"
    assert compact_json.loads(b"-9223372036854775809") == -(2**63) - 1  # ends the text
    assert compact_json.loads(b"[12345678901234567890123 ]") == [12345678901234567890123]


def test_long_digit_runs_ending_a_string_take_the_faster_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's request ids end in twenty digits: not a number, no reason for json."""

    def slower(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("json ran")

    record = {"x-amz-request-id": "ec17cee9-fe30.4101.12074218314347841223", "size": 100}
    monkeypatch.setattr(compact_json.json, "loads", slower)
    assert compact_json.loads(json.dumps(record).encode()) == record
    line = {"body": json.dumps(record)}  # a store's batch line: escaped quotes
    assert compact_json.loads(json.dumps(line).encode()) == line


@pytest.mark.parametrize("text", [b"NaN", b"[-Infinity]", b'{"n": 1e400}'])
def test_finite_refuses_what_no_json_reader_takes_back(text: bytes) -> None:
    with pytest.raises(ValueError, match=r"not JSON|beyond a float"):
        compact_json.loads(text, finite=True)
    assert not all(map(math.isfinite, _numbers(compact_json.loads(text))))


def test_not_utf8_and_deep_nesting_fail_as_json_fails() -> None:
    with pytest.raises(ValueError):
        compact_json.loads(b'"\xff"')
    with pytest.raises(ValueError):
        compact_json.loads('"x"'.encode("utf-16"))  # json.loads(bytes) would guess UTF-16
    with pytest.raises(RecursionError):
        compact_json.loads(b"[" * 100_000 + b"]" * 100_000)


def test_nan_is_refused_where_json_writes_it() -> None:
    with pytest.raises(ValueError):
        compact_json.dumps({"key": "\udc80", "n": math.nan})


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, float) else []
