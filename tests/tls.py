"""Test PKI made with the openssl CLI: CAs and server certificates for 127.0.0.1.

Each call makes fresh keys in a directory of the test's own; nothing is shared or reused.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


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
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", key, "-out", csr, cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
        "-days", "2", "-extfile", ext, "-out", cert, cwd=directory,
    )  # fmt: skip
    return ServerCertificate(cert, key)
