"""JSON on the event path: orjson where it gives what ``json`` gives, ``json`` elsewhere.

Every event is decoded and encoded several times between the ingest and the endpoint (the
gateway's body, the queued record, the store's batch line, the pushed body, the delivery
record). orjson does each in a fraction of the time (docs/performance-notes.md). It
differs from ``json`` in a few corners: it reads integers beyond 64 bits as floats
(silently losing digits), refuses escaped lone surrogates, NaN and numbers beyond a float,
and cannot write a str holding surrogates or an integer beyond 64 bits. There ``json``
runs instead, so the values read and what is accepted never depend on which one ran.
What is written may differ in how a float is spelled (``1e-7`` for ``1e-07``): the same
number to every reader.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

_CLASSES = bytes(0x30 if 0x30 <= c <= 0x39 else 0x22 if c in b'"\\' else 0x20 for c in range(256))
"""For ``bytes.translate``: every digit to ``0``, a quote or backslash to ``"``, the rest to
a space."""
_LONG_RUN = b"0" * 19
_LONG_NUMBER = _LONG_RUN + b" "
"""Nineteen digits or more may be an integer beyond 64 bits, which orjson would read as a
float: such text goes to ``json``. In valid JSON a number is never followed by a quote or
a backslash, a string often is (the gateway's request ids end in twenty digits), so only a
run followed by something else, or ending the text, counts. (A regular expression took ten
times as long as the translation, most of orjson's gain.)"""

_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is beyond a float")
    return value


def loads(data: bytes, *, finite: bool = False) -> Any:
    """What ``json.loads(data.decode("utf-8"))`` gives (UTF-8 only, not the UTF-16 or -32
    ``json.loads`` would guess from bytes). ``finite``: refuse NaN, Infinity and numbers
    beyond a float too, which no JSON reader takes back once written. Raises ValueError
    (invalid UTF-8 or JSON) or RecursionError (nested too deep)."""
    classes = data.translate(_CLASSES)
    if _LONG_NUMBER not in classes and not classes.endswith(_LONG_RUN):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json says what is wrong, or takes what orjson will not
    text = data.decode("utf-8")
    if finite:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    return json.loads(text)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, key order kept. Lone surrogates raise UnicodeEncodeError (not
    UTF-8), NaN and infinities ValueError when ``json`` writes the value; orjson, which
    writes them as null, only gets values it reads back the same (``loads(finite=True)``
    output, or values of our own)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _COMPACT.encode(value).encode()
