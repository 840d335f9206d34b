"""A certificate authority and a server certificate made for a test with the `openssl`
command: no key or certificate is kept in the repository, and none outlives the test run."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA that signed the server certificate (PEM)
    other_ca: Path  # a CA that signed nothing here: trusting only it must fail
    cert: Path  # the server certificate (PEM)
    key: Path  # its private key (PEM)


def make_certificates(folder: Path, dns_names: Sequence[str] = ("localhost",)) -> Certificates:
    """A server certificate for 127.0.0.1 and ``dns_names``, signed by a fresh CA (P-256
    keys, valid two days)."""
    _make_ca(folder, "ca", "LogHub test CA")
    _make_ca(folder, "other", "Some other CA")
    names = ",".join(["IP:127.0.0.1", *(f"DNS:{name}" for name in dns_names)])
    extensions = folder / "server.ext"
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        f"subjectAltName={names}\n"
    )
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", folder / "server.key", "-out", folder / "server.csr", "-subj", "/CN=localhost",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", folder / "server.csr", "-CA", folder / "ca.pem",
        "-CAkey", folder / "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", extensions, "-out", folder / "server.pem",
    )  # fmt: skip
    return Certificates(
        folder / "ca.pem", folder / "other.pem", folder / "server.pem", folder / "server.key"
    )


def _make_ca(folder: Path, name: str, common_name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", folder / f"{name}.key", "-out", folder / f"{name}.pem", "-days", "2",
        "-subj", f"/CN={common_name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)
