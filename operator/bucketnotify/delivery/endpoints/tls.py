"""TLS client contexts for every endpoint kind, and naming TLS failures."""

from __future__ import annotations

import ssl

from bucketnotify.delivery.endpoints.errors import ConfigurationError

__all__ = ["client_context", "describe_tls_failure"]


def client_context(*, verify: bool, ca_pem: str | None) -> ssl.SSLContext:
    """A client context that verifies the server against ``ca_pem`` or the system CAs.

    As in the reference's ``ca-location``: when a CA bundle is given, it alone authenticates
    the server (the system CAs are not loaded). ``verify=False`` checks neither the chain nor
    the host name (the gateway's ``verify-ssl=false``).
    """
    if not verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if ca_pem is None:
        return ssl.create_default_context()
    if "-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise ConfigurationError("the CA bundle holds no PEM certificate")
    try:
        return ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigurationError(f"the CA bundle is not valid PEM: {exc}") from None


def describe_tls_failure(exc: BaseException) -> str | None:
    """A short reason when ``exc`` (or an exception it wraps) is a TLS failure, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return f"TLS certificate verification failed: {current.verify_message}"
        if isinstance(current, ssl.SSLError):
            return f"TLS handshake failed: {current.reason or current}"
        current = current.__cause__ or current.__context__
    return None
