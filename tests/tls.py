"""Test PKI made with the openssl CLI: CAs, server certificates for 127.0.0.1 and client
certificates.

Each call makes fresh keys in a directory of the test's own; nothing is shared or reused.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bucketnotify.api.topic import ClientCertificate


@dataclass(frozen=True)
class CertificateAuthority:
    cert: Path
    key: Path

    @property
    def pem(self) -> str:
        return self.cert.read_text()


@dataclass(frozen=True)
class ServerCertificate:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> CertificateAuthority:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", key, "-out", cert,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return CertificateAuthority(cert, key)


def issue_server_certificate(
    ca: CertificateAuthority, directory: Path, name: str
) -> ServerCertificate:
    """A certificate for 127.0.0.1 and localhost signed by ``ca``."""
    cert, key = _issue(
        ca,
        directory,
        name,
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )
    return ServerCertificate(cert, key)


def _issue(
    ca: CertificateAuthority, directory: Path, name: str, subject: str, extensions: str
) -> tuple[Path, Path]:
    """A key and a certificate for ``subject`` with ``extensions``, signed by ``ca``."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
        "-keyout", key, "-out", csr, cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
        "-days", "2", "-extfile", ext, "-out", cert, cwd=directory,
    )  # fmt: skip
    return cert, key


def issue_client_certificate(
    ca: CertificateAuthority, directory: Path, name: str, *, password: str | None = None
) -> ClientCertificate:
    """A client certificate (clientAuth) for ``name`` signed by ``ca``, its key in PEM,
    encrypted with ``password`` when given: what a ``kubernetes.io/tls`` Secret holds."""
    cert, key = _issue(
        ca,
        directory,
        name,
        f"/CN={name}",
        "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
    )
    if password is not None:
        encrypted = directory / f"{name}-encrypted.key"
        _openssl(
            "pkey", "-in", key, "-aes256", "-passout", f"pass:{password}", "-out", encrypted,
            cwd=directory,
        )  # fmt: skip
        key = encrypted
    return ClientCertificate(cert.read_text(), key.read_text(), password)


def client_certificate_of(
    files: dict[str, str], prefix: str, *, encrypted: bool = False
) -> ClientCertificate:
    """The client certificate a local service's env names (``<prefix>_CLIENT_CERT``,
    ``_KEY``, ``_ENCRYPTED_KEY``, ``_KEY_PASSWORD``: files)."""
    cert = Path(files[f"{prefix}_CLIENT_CERT"]).read_text()
    if not encrypted:
        return ClientCertificate(cert, Path(files[f"{prefix}_CLIENT_KEY"]).read_text())
    return ClientCertificate(
        cert,
        Path(files[f"{prefix}_CLIENT_ENCRYPTED_KEY"]).read_text(),
        Path(files[f"{prefix}_CLIENT_KEY_PASSWORD"]).read_text().strip(),
    )
