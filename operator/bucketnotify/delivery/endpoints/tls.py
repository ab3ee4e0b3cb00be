"""TLS client contexts for every endpoint kind, and naming TLS failures."""

from __future__ import annotations

import os
import ssl
import tempfile

from bucketnotify.api.topic import ClientCertificate
from bucketnotify.delivery.endpoints.errors import ConfigurationError

__all__ = ["client_context", "describe_tls_failure"]


def client_context(
    *, verify: bool, ca_pem: str | None, client: ClientCertificate | None = None
) -> ssl.SSLContext:
    """A client context that verifies the server against ``ca_pem`` or the system CAs, and
    presents ``client``'s certificate when the server asks for one (mutual TLS).

    As in the reference's ``ca-location``: when a CA bundle is given, it alone authenticates
    the server (the system CAs are not loaded). ``verify=False`` checks neither the chain nor
    the host name (the gateway's ``verify-ssl=false``).
    """
    context = _server_check(verify=verify, ca_pem=ca_pem)
    if client is not None:
        _load_client(context, client)
    return context


def _server_check(*, verify: bool, ca_pem: str | None) -> ssl.SSLContext:
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


def _load_client(context: ssl.SSLContext, client: ClientCertificate) -> None:
    """Python's ssl loads a certificate chain from files only: the PEM goes to a file that
    only this process may read, in memory where the system has it (/dev/shm), for as long
    as the load takes. Errors name what is wrong, never the key."""
    if "-----BEGIN CERTIFICATE-----" not in client.certificate:
        raise ConfigurationError("the client certificate holds no PEM certificate")
    if "PRIVATE KEY-----" not in client.private_key:
        raise ConfigurationError("the client certificate's private key is not a PEM key")
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None  # noqa: S108 - private files
    with tempfile.TemporaryDirectory(dir=where) as private:
        os.chmod(private, 0o700)
        chain = os.path.join(private, "chain.pem")
        fd = os.open(chain, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(client.private_key.rstrip() + "\n" + client.certificate)
        try:
            # Never None: OpenSSL would then ask for an encrypted key's password on a terminal.
            context.load_cert_chain(chain, password=client.password or "")
        except ssl.SSLError as exc:
            raise ConfigurationError(_why_not_loaded(exc, client)) from None


def _why_not_loaded(exc: ssl.SSLError, client: ClientCertificate) -> str:
    if "KEY_VALUES_MISMATCH" in (exc.reason or "").upper():
        return "the client certificate's private key does not belong to its certificate"
    # OpenSSL says only "PEM lib" of a key it could not decrypt: the key's header tells.
    if "ENCRYPTED" in client.private_key:
        if client.password:
            return "the client certificate's private key password is wrong"
        return "the client certificate's private key is encrypted: set keyPasswordKey"
    return f"the client certificate cannot be loaded: {exc.reason or exc.strerror or 'SSLError'}"


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
