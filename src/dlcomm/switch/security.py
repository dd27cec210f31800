"""The switch's TLS identity and admin token (docs/security.md).

- :func:`identity`: the switch's TLS server context, from given certificate and key files or
  a fresh self-signed EC P-256 certificate made at start-up (written to a private directory
  only while the context loads it: nothing is left behind, even by a killed switch). Its
  SHA-256 fingerprint (:func:`fingerprint`) is what clients pin: ``dlcomm switch serve``
  prints it, and the launchers that start a switch hand it to their workers.
- :func:`client_context` and :func:`check_pinned`: clients speak TLS 1.3 and accept only
  the certificate whose fingerprint they were given (no CA: the fingerprint *is* the trust).
- :func:`load_token`: the admin token that registration and statistics require when the
  switch listens beyond loopback; a file, created with a random token (mode 0600) if
  missing. Tokens are compared in constant time (:func:`token_matches`).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import os
import secrets
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Identity", "identity", "fingerprint", "client_context",
           "check_pinned", "load_token", "token_matches", "needs_token"]


@dataclass(frozen=True)
class Identity:
    context: ssl.SSLContext  # the server side of TLS 1.3, certificate and key loaded
    fingerprint: str         # sha256 of the certificate's DER, hex


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def _self_signed(directory: Path, host: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dlcomm switch")])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=365)))
    try:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False)
    except ValueError:
        pass  # not an address literal: the fingerprint is what clients check anyway
    cert = builder.sign(key, hashes.SHA256())
    cert_file, key_file = directory / "switch.crt", directory / "switch.key"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file


def identity(host: str, cert: str | None = None, key: str | None = None) -> Identity:
    """The given certificate and key, or a fresh self-signed pair (for ``host``)."""
    if cert or key:
        if not (cert and key):
            raise ValueError("--cert and --key go together")
        return _load(Path(cert), Path(key))
    temporary = Path(tempfile.mkdtemp(prefix="dlcomm-switch-tls-"))
    try:
        return _load(*_self_signed(temporary, host))
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _load(cert_file: Path, key_file: Path) -> Identity:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert_file, key_file)
    der = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
    return Identity(ctx, fingerprint(der))


def client_context() -> ssl.SSLContext:
    """TLS 1.3 without a CA: :func:`check_pinned` checks the certificate after the handshake."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_pinned(sock: ssl.SSLSocket, expected: str) -> None:
    """Raise ssl.SSLError unless the peer's certificate has the fingerprint ``expected``."""
    der = sock.getpeercert(binary_form=True)
    if der is None or not hmac.compare_digest(fingerprint(der), expected.lower()):
        raise ssl.SSLError("the switch's certificate is not the one pinned "
                           f"(sha256 {fingerprint(der)[:16] if der else 'none'}..., "
                           f"expected {expected[:16]}...)")


def needs_token(host: str) -> bool:
    """A switch that listens beyond loopback requires the admin token."""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def load_token(path: str) -> str:
    """The token in ``path``; a new random one (mode 0600) if the file does not exist."""
    p = Path(path)
    try:
        if not p.exists():
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        token = p.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read or create the admin token {path}: "
                         f"{exc.strerror or exc}") from exc
    if len(token) < 16:
        raise ValueError(f"the admin token in {path} is too short (16 characters at least)")
    return token


def token_matches(given: object, expected: str | None) -> bool:
    """Whether ``given`` is the admin token (always, when none is required)."""
    if expected is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())
