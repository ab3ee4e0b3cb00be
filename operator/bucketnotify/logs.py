"""Process logging of ``bucketnotify operator`` and ``bucketnotify delivery``: JSON or plain
lines on stderr, with secrets redacted from every record.

- JSON (python-json-logger, the library kopf's own ``--log-format=json`` uses) has kopf's
  field names: ``timestamp``, ``severity``, ``message``, ``object`` (the Kubernetes object
  a kopf handler logged about), plus ``logger`` and, for exceptions, ``exc_info``.
- Plain: ``<time> <LEVEL> <logger>: [namespace/name] <message>``.
- ``auto`` (the default): plain on a terminal, JSON otherwise (in a pod, under systemd).

Redaction is a safety net, applied to the message after its arguments are merged, the
exception text, the stack and every string passed in ``extra``: no code of ours logs a
secret on purpose, but driver messages and URLs pass through. It replaces the password
part of URLs (``scheme://user:password@``), ``token=``-like query parameters,
``Authorization`` values, the token segment of ingest URLs, the ``data`` of Secret objects
in API responses (logged at DEBUG by the Kubernetes client) and every value registered with
``remember_secrets`` (Secret values the process has read under a secret-looking key).

This module imports nothing of ours: every layer may use it.
"""

from __future__ import annotations

import base64
import copy
import logging
import re
import sys
from collections.abc import Iterable
from typing import Any, Literal, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

__all__ = [
    "JsonFormatter",
    "LogFormat",
    "PlainFormatter",
    "RedactingFilter",
    "configure",
    "redact",
    "remember_secrets",
    "secret_key_name",
]

LogFormat = Literal["auto", "json", "plain"]

MASK = "***"

# kopf puts these on the records of its per-object loggers: the object reference, whether
# to post the record as an Event, and the operator's settings object.
_KOPF_ATTRS = ("k8s_ref", "k8s_skip", "settings")
_STANDARD_ATTRS = frozenset(RESERVED_ATTRS) | set(_KOPF_ATTRS) | {"message", "asctime"}

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host and scheme://token@host: the whole userinfo goes.
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"<>]+@"), rf"\1{MASK}@"),
    # Query or form parameters that carry credentials (including presigned S3 URLs).
    (
        re.compile(
            r"(?i)\b((?:access[_-]?token|token|password|passwd|pwd|secret|secret[_-]?key|"
            r"api[_-]?key|apikey|sig|signature|x-amz-signature|x-amz-credential|"
            r"x-amz-security-token|awsaccesskeyid|client[_-]?secret)=)[^&\s'\"]+"
        ),
        rf"\1{MASK}",
    ),
    # Authorization: Basic/Bearer/AWS4-HMAC-SHA256 ..., as a header line or a dict entry.
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)"
            r"(?:(basic|bearer|digest|aws4-hmac-sha256|aws)\s+)?[^'\"\n]+"
        ),
        rf"\1\2 {MASK}",
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+"), rf"\1{MASK}"),
    # The ingest URL's last segment is the Topic's token: /v1/topics/<ns>/<topic>/<token>.
    (re.compile(r"(/v1/topics/[^/\s]+/[^/\s]+/)[^/\s?#'\"]+"), rf"\1{MASK}"),
)

# Secret objects as the API server sends them (an HTTP client may log response bodies at
# DEBUG): the values of "data" and "stringData" are the secrets, base64 or not.
_SECRET_OBJECT = re.compile(r'"kind":\s*"Secret(?:List)?"')
_SECRET_DATA = re.compile(r'("(?:data|stringData)":\s*\{)[^{}]*(\})')

_SECRET_KEY_NAME = re.compile(r"(?i)(pass|secret|token|credential|private)")
# A short value (a one-letter password in a test) would blank out ordinary words; a huge
# one is a certificate bundle or a file, not a credential.
_MIN_SECRET, _MAX_SECRET = 6, 4096
_MAX_REMEMBERED = 10_000

_known: set[str] = set()
_known_sorted: list[str] = []


def secret_key_name(key: str) -> bool:
    """Whether a Secret key's name says its value is a credential (``password``,
    ``secretKey``, ``token``), as opposed to a user name, an endpoint or a CA bundle."""
    return bool(_SECRET_KEY_NAME.search(key))


def remember_secrets(values: Iterable[str]) -> None:
    """Redact these exact values, and their base64 form (as in a Secret's ``data``), from
    every later log record (and ``redact`` result)."""
    global _known_sorted
    added = False
    for secret in values:
        for value in (secret, base64.b64encode(secret.encode()).decode()):
            if (
                _MIN_SECRET <= len(value) <= _MAX_SECRET
                and value not in _known
                and len(_known) < _MAX_REMEMBERED
            ):
                _known.add(value)
                added = True
    if added:
        # Longest first, so a secret that contains another is replaced whole.
        _known_sorted = sorted(_known, key=len, reverse=True)


def redact(text: str) -> str:
    """``text`` with credentials in URLs, headers and parameters and every remembered
    secret value replaced by ``***``."""
    for secret in _known_sorted:
        if secret in text:
            text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    if _SECRET_OBJECT.search(text):
        text = _SECRET_DATA.sub(rf"\1{MASK}\2", text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites every record it sees so that no formatter or handler after it can print a
    secret: the merged message, the exception and stack text, string extras."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the raw parts, redacted
            message = f"{record.msg!s} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        if record.exc_info:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(text)
            # Formatters re-render exc_info when it is set; the redacted text stands in.
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD_ATTRS and isinstance(value, str):
                setattr(record, key, redact(value))
        return True


def _object_ref(record: logging.LogRecord) -> dict[str, Any] | None:
    ref = getattr(record, "k8s_ref", None)
    if not isinstance(ref, dict):
        return None
    return {k: v for k, v in ref.items() if v}


class JsonFormatter(_JsonFormatter):
    """One JSON object per line, with kopf's field names (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "severity", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, *_KOPF_ATTRS],
            timestamp=True,
        )

    def add_fields(
        self,
        log_record: dict[str, Any],
        record: logging.LogRecord,
        message_dict: dict[str, Any],
    ) -> None:
        super().add_fields(log_record, record, message_dict)
        log_record["severity"] = record.levelname.lower()
        ref = _object_ref(record)
        if ref:
            log_record["object"] = ref


class PlainFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: [namespace/name] <message>`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        ref = _object_ref(record)
        if ref and "name" in ref:
            where = f"{ref['namespace']}/{ref['name']}" if "namespace" in ref else ref["name"]
            record = copy.copy(record)  # other handlers see the record unprefixed
            record.msg = f"[{where}] {record.msg}"
        return super().format(record)


class RetriedAtWarning(logging.Filter):
    """kopf logs at ERROR what it tries again: a handler's retried failure ("failed
    temporarily": an expected wait, a Topic not Ready yet) and a request to the API server
    it sends again ("Request attempt #1/9 failed; will retry": the API server throttling
    with 429, or away). Both are WARNINGs, as every other transient failure of ours is.
    Their last attempts ("will exceed", "escalating") and permanent failures stay ERROR:
    those need a person."""

    RETRIED = (" failed temporarily: ", " failed; will retry: ")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and any(r in str(record.msg) for r in self.RETRIED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class _Handler(logging.StreamHandler[TextIO]):
    """Ours, so a second ``configure`` replaces it instead of adding another."""


def configure(
    log_format: LogFormat = "auto", level: str = "INFO", stream: TextIO | None = None
) -> Literal["json", "plain"]:
    """Send every record of the process to ``stream`` (stderr) in ``log_format``, redacted;
    returns the format chosen for ``auto``."""
    out = stream if stream is not None else sys.stderr
    chosen: Literal["json", "plain"] = (
        ("plain" if out.isatty() else "json") if log_format == "auto" else log_format
    )
    handler = _Handler(out)
    handler.setFormatter(JsonFormatter() if chosen == "json" else PlainFormatter())
    handler.addFilter(RedactingFilter())
    # On the handler, not a logger: kopf logs its requests' retries through the logger of
    # the object (kopf.objects) or of its client module, and a filter on a logger sees only
    # the records made by that very logger.
    handler.addFilter(RetriedAtWarning())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _Handler)]
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx logs every request URL at INFO, and a webhook URL often carries its own token:
    # only its warnings are worth a line, and only at DEBUG do we want the rest.
    if root.level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    # The brokers' drivers log each failed attempt, at ERROR (aiokafka: a wrong SASL password
    # made 58 lines a few minutes from each replica). The endpoint reports the failure
    # itself, in the round's line and on the Topic; the drivers' lines are for DEBUG.
    for driver in ENDPOINT_DRIVERS:
        logging.getLogger(driver).setLevel(
            logging.NOTSET if root.level <= logging.DEBUG else logging.CRITICAL
        )
    return chosen


ENDPOINT_DRIVERS = ("aiokafka", "aio_pika", "aiormq")
"""Loggers of the libraries that push to brokers: silent but for CRITICAL unless at DEBUG."""
