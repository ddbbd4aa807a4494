"""Issuing node identities from the cluster CA.

``issue`` is a pure function of the authority, the node id, the validity and a
clock; ``load_authority`` is the only thing here that reads files, and it reads
them on the machine running Pulumi: the CA key never goes anywhere else, and
never into state (it is read from the PKI dir at issue time, not passed as an
input).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import AuthorityError


@dataclass(frozen=True)
class Authority:
    """The cluster CA: its certificate (public) and its private key (never leaves this process)."""

    cert: x509.Certificate
    key: object = field(repr=False)

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class IssuedCertificate:
    cert_pem: str
    key_pem: str = field(repr=False)
    serial: str
    """Hex, because serials exceed the 2**53 that survives Pulumi's float numbers."""
    not_after: str
    """ISO 8601, UTC."""
    fingerprint_sha256: str


def _signs(ca_cert: x509.Certificate, ca_key: object) -> bool:
    """Does ca_key belong to ca_cert? Compared by public key, no signing needed."""
    return bool(ca_cert.public_key() == ca_key.public_key())  # type: ignore[attr-defined]


def load_authority(pki_dir: str, node: str, now: dt.datetime | None = None) -> Authority:
    """Read ca.pem and ca-key.pem from the PKI dir and check they can issue today."""
    now = now or dt.datetime.now(dt.UTC)
    d = Path(pki_dir)
    cert_path, key_path = d / "ca.pem", d / "ca-key.pem"
    if not cert_path.is_file() or not key_path.is_file():
        missing = ", ".join(p.name for p in (cert_path, key_path) if not p.is_file())
        raise AuthorityError(node, f"no authority in {pki_dir} ({missing} missing); create one first")
    if not os.access(key_path, os.R_OK):
        raise AuthorityError(node, f"cannot read {key_path}",
                             "run Pulumi as a user that may read the CA key (only the CA host can issue identities)")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as exc:
        raise AuthorityError(node, f"{cert_path} is not a PEM certificate") from exc
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        # The exception text may quote key bytes; say only which file it was.
        raise AuthorityError(node, f"{key_path} is not an unencrypted PEM private key") from None
    if not _signs(cert, key):
        raise AuthorityError(node, f"{key_path.name} does not belong to {cert_path.name} in {pki_dir}",
                             "restore the matching pair from backup; a CA key that does not match its certificate cannot issue identities")
    if cert.not_valid_after_utc <= now:
        raise AuthorityError(node, f"the CA in {pki_dir} expired on {cert.not_valid_after_utc:%Y-%m-%d}",
                             "rotate the cluster CA ('llmgw ctl cert init-ca' in a new dir) and re-onboard the nodes")
    if cert.not_valid_before_utc > now:
        raise AuthorityError(node, f"the CA in {pki_dir} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M}",
                             "check this machine's clock")
    return Authority(cert=cert, key=key)


def _sign_hash(key: object) -> hashes.HashAlgorithm | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def issue(authority: Authority, node_id: str, validity: dt.timedelta, now: dt.datetime) -> IssuedCertificate:
    """A fresh client certificate and key for ``node_id`` (CN = node id, clientAuth), signed by the CA.

    Validity is capped at the CA's own expiry: a leaf that outlives its issuer
    would fail verification anyway, later and more confusingly.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    not_before = now - dt.timedelta(minutes=5)  # tolerate small clock skew on the node
    not_after = min(now + validity, authority.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False,
                          crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()), critical=False)  # type: ignore[attr-defined]
        .sign(authority.key, _sign_hash(authority.key))  # type: ignore[arg-type]
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return IssuedCertificate(
        cert_pem=cert_pem,
        key_pem=key_pem,
        serial=format(cert.serial_number, "x"),
        not_after=not_after.isoformat(),
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
    )


def verify_issued(ca_pem: str, cert_pem: str) -> bool:
    """Was cert_pem signed by the CA in ca_pem? (How a test checks what a node holds.)"""
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
