"""The gateway's failures, mapped from botocore's at the edge.

    GatewayError
    ├── GatewayUnreachable      no answer: connection refused, timeout, DNS
    ├── GatewayAccessDenied     wrong keys or no permission
    │   └── GatewayForeignTopic the topic is another gateway user's (Ceph 19+ topic owners)
    ├── GatewayInvalidArgument  the gateway refused what we sent
    ├── GatewayNotFound         the topic or bucket is not there
    └── GatewayServerError      a 5xx: worth trying again soon (Ceph 16 answers 500 when two
                                writes to one tenant's topics meet)

Messages never carry credentials: botocore's own messages name the operation and the
gateway's error code, not the keys.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

__all__ = [
    "GatewayAccessDenied",
    "GatewayError",
    "GatewayForeignTopic",
    "GatewayInvalidArgument",
    "GatewayNotFound",
    "GatewayServerError",
    "GatewayUnreachable",
    "error_code",
    "error_for_response",
    "mapped_errors",
]


class GatewayError(Exception):
    """A gateway call failed; ``reason`` is a CamelCase word for conditions."""

    reason = "GatewayError"


class GatewayUnreachable(GatewayError):
    reason = "GatewayUnreachable"


class GatewayAccessDenied(GatewayError):
    reason = "GatewayAccessDenied"


class GatewayForeignTopic(GatewayAccessDenied):
    """Ceph 19 and later give each topic an owner: another user's topic may be neither
    read, nor written, nor deleted (403 AuthorizationError, "Topic was created by another
    user."). 16.2 and 18.2 have no owners: any user of the tenant overwrites a topic."""

    reason = "NameConflict"


class GatewayInvalidArgument(GatewayError):
    reason = "GatewayRefused"


class GatewayNotFound(GatewayError):
    reason = "NotFound"


class GatewayServerError(GatewayError):
    # The reason of any other gateway failure: the condition says "GatewayError" as before.
    reason = "GatewayError"


ACCESS_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AuthorizationError",
}
# Ceph 20.2's message for a topic of another user (its only sign: the code is any denial's).
FOREIGN_TOPIC = "created by another user"
NOT_FOUND = {"NotFound", "NoSuchKey", "NoSuchBucket", "NoSuchEntity", "ResourceNotFoundException"}


def error_for_response(operation: str, status: int, code: str, detail: str = "") -> GatewayError:
    """Our error kind for a gateway's error answer: its HTTP status and S3 error code.

    For clients that speak HTTP themselves rather than through botocore; the same rules as
    ``mapped_errors``. ``detail`` is the gateway's own message, which names no credentials.
    """
    message = f"{operation}: the gateway answered {status} {code}".rstrip()
    if code == "NoSuchBucket":
        # Ceph sends no message with it, and a bare code reads like a bug of ours.
        message += " (the bucket does not exist)"
    if detail:
        message += f": {detail}"
    if code == "AuthorizationError" and FOREIGN_TOPIC in detail:
        return GatewayForeignTopic(message)
    if code in ACCESS_DENIED or status == 403:
        return GatewayAccessDenied(message)
    if code in NOT_FOUND or status == 404:
        return GatewayNotFound(message)
    if 400 <= status < 500:
        return GatewayInvalidArgument(message)
    if status >= 500:
        return GatewayServerError(message)
    return GatewayError(message)


def error_code(body: bytes) -> tuple[str, str]:
    """The Code and Message of the gateway's S3 error document (in any XML namespace or
    none); empty when the body is no such document."""
    try:
        root = ET.fromstring(body)  # noqa: S314 - the gateway's own answer
    except ET.ParseError:
        return "", ""
    return (root.findtext("{*}Code") or "").strip(), (root.findtext("{*}Message") or "").strip()


@contextmanager
def mapped_errors(operation: str) -> Iterator[None]:
    """Run a gateway call and raise our error kinds instead of botocore's."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        raise error_for_response(operation, status, code, str(error.get("Message", ""))) from None
    except (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionError) as exc:
        raise GatewayUnreachable(
            f"{operation}: the gateway did not answer ({type(exc).__name__})"
        ) from None
    except BotoCoreError as exc:
        raise GatewayError(f"{operation}: {type(exc).__name__}") from None
