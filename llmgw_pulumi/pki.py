"""Issuing node identities from the cluster CA.

``issue`` is a pure function of the authority, the node id, the validity and a
clock; ``load_authority`` is the only thing here that reads files, and it reads
them on the machine running Pulumi: the CA key never goes anywhere else, and
never into state (it is read from the PKI dir at issue time, not passed as an
input).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import AuthorityError, CertificateRequestError, SignedCertificateError
from .signer import CLOCK_SKEW, SigningRequest


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
    _check_authority(cert, None, f"in {pki_dir}", node, now)
    return Authority(cert=cert, key=key)


def _sign_hash(key: object) -> hashes.HashAlgorithm | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey
"""The public keys a node's key pair may have."""


def issue(authority: Authority, node_id: str, validity: dt.timedelta, now: dt.datetime,
          public_key: PublicKey | None = None) -> IssuedCertificate:
    """A fresh client certificate for ``node_id`` (CN = node id, clientAuth), signed by the CA.

    With ``public_key`` (from the node's CSR, see ``requested_key``) the
    certificate is issued for it and no key is made here (``key_pem`` is
    empty); without, a new P-256 key pair is made here (keyOrigin operator).
    Validity is capped at the CA's own expiry: a leaf that outlives its issuer
    would fail verification anyway, later and more confusingly.
    """
    key = None if public_key is not None else ec.generate_private_key(ec.SECP256R1())
    subject_key = public_key if public_key is not None else key.public_key()  # type: ignore[union-attr]
    not_before = now - dt.timedelta(minutes=5)  # tolerate small clock skew on the node
    not_after = min(now + validity, authority.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(authority.cert.subject)
        .public_key(subject_key)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(subject_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()), critical=False)  # type: ignore[attr-defined]
        .sign(authority.key, _sign_hash(authority.key))  # type: ignore[arg-type]
    )
    key_pem = "" if key is None else key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return dataclasses.replace(described(cert), key_pem=key_pem)


def verify_issued(ca_pem: str, cert_pem: str) -> bool:
    """Was cert_pem signed by the CA in ca_pem? (How a test checks what a node holds.)"""
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


MIN_RSA_BITS = 2048


def requested_key(csr_pem: str, node_id: str) -> PublicKey:
    """The public key of the CSR a node made for itself, once its signature proves the node holds the private key.

    Only the key is taken from the request: the certificate's subject, usage
    and validity are the operator's (``issue``), whatever the request asks for.
    """
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
    except ValueError:
        raise CertificateRequestError(node_id, "the node returned something that is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise CertificateRequestError(node_id, "the node's certificate signing request is not signed by its own key")
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.key_size >= 256:
        return key
    if isinstance(key, rsa.RSAPublicKey) and key.key_size >= MIN_RSA_BITS:
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    raise CertificateRequestError(node_id, f"the node's key ({type(key).__name__}) is too weak to sign for",
                                  "make the node's key P-256 or stronger (ECDSA), RSA of 2048 bits or more, or Ed25519")


def spki_b64(cert_pem: str) -> str:
    """The certificate's public key as base64 of its DER SubjectPublicKeyInfo: how node-key.sh prints a key's."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


def described(cert: x509.Certificate, cert_pem: str | None = None) -> IssuedCertificate:
    """An issued certificate's record (no key: it stays where it was made); ``cert_pem``: its text as found."""
    return IssuedCertificate(
        cert_pem=cert_pem or cert.public_bytes(serialization.Encoding.PEM).decode(),
        key_pem="",
        serial=format(cert.serial_number, "x"),
        not_after=cert.not_valid_after_utc.isoformat(),
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
    )


def adoptable(authority: Authority, node_id: str, cert_pem: str | None, key_spki: str, renew_before: dt.timedelta,
              now: dt.datetime) -> IssuedCertificate | None:
    """The identity a node already holds, when it can be kept as it is: None when a new one must be issued.

    Kept when the certificate's CN is the node id, it is issued by this CA for
    client authentication, it is valid now and not yet in the renewal window,
    and the node's key (``key_spki``, its public half as node-key.sh prints it)
    is the certificate's. This is how the first `pulumi up` over a node that
    onboard-node.sh onboarded takes it over without re-issuing.
    """
    if not cert_pem or not key_spki:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        cert.verify_directly_issued_by(authority.cert)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    record = described(cert, cert_pem)  # the node's very text: installing it again rewrites nothing
    if (
        [n.value for n in names] != [node_id]
        or ExtendedKeyUsageOID.CLIENT_AUTH not in usage
        or not cert.not_valid_before_utc <= now
        or cert.not_valid_after_utc - renew_before <= now
        or spki_b64(record.cert_pem) != key_spki
    ):
        return None
    return record


# --------------------------------------------------------------------------- signers (llmgw_pulumi.signer)


def _check_authority(cert: x509.Certificate, key: object | None, where: str, node: str, now: dt.datetime) -> None:
    if key is not None and not _signs(cert, key):
        raise AuthorityError(node, f"the CA key does not belong to the CA certificate {where}",
                             "give the key and the certificate of the same CA")
    if cert.not_valid_after_utc <= now:
        raise AuthorityError(node, f"the CA {where} expired on {cert.not_valid_after_utc:%Y-%m-%d}",
                             "rotate the cluster CA ('llmgw ctl cert init-ca' in a new dir) and re-onboard the nodes")
    if cert.not_valid_before_utc > now:
        raise AuthorityError(node, f"the CA {where} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M}",
                             "check this machine's clock")


def ca_certificate(ca_pem: str, node: str, now: dt.datetime) -> x509.Certificate:
    """The CA certificate of llmgw:signer.ca, checked to be valid now."""
    try:
        cert = x509.load_pem_x509_certificate(ca_pem.encode())
    except ValueError:
        raise AuthorityError(node, "llmgw:signer.ca is not a PEM certificate",
                             "give the CA certificate (ca.pem) as a path or as its PEM text") from None
    _check_authority(cert, None, "in llmgw:signer.ca", node, now)
    return cert


def authority_from_pem(ca_pem: str, key_pem: str, node: str, now: dt.datetime) -> Authority:
    """The authority of signer caKey: the certificate of llmgw:signer.ca, the key of the llmgw:caKey secret."""
    cert = ca_certificate(ca_pem, node, now)
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError):
        # Never quote the value: it is the CA key.
        raise AuthorityError(node, "the llmgw:caKey secret is not an unencrypted PEM private key",
                             "set it again: `pulumi config set --secret llmgw:caKey < ca-key.pem`") from None
    _check_authority(cert, key, "of llmgw:signer.ca and llmgw:caKey", node, now)
    return Authority(cert=cert, key=key)


def issue_for_request(authority: Authority, req: SigningRequest) -> str:
    """The certificate PEM a key in this process signs for a signer request (see ``issue``)."""
    key = requested_key(req.csr_pem, req.node_id)
    issued = issue(authority, req.node_id, req.not_after - req.not_before - CLOCK_SKEW,
                   req.not_before + CLOCK_SKEW, public_key=key)
    return issued.cert_pem


def operator_key_and_csr(node_id: str) -> tuple[str, str]:
    """keyOrigin operator: a new P-256 key pair made here (its PEM, unencrypted, for state as a secret) and its
    CSR, for any signer."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return key_pem, csr.public_bytes(serialization.Encoding.PEM).decode()


def signed_problems(ca: x509.Certificate, cert: x509.Certificate, req: SigningRequest, now: dt.datetime,
                    tolerance: dt.timedelta = CLOCK_SKEW) -> list[str]:
    """What is wrong with the certificate a signer returned for ``req``: empty when it is the one asked for.

    Issued by ``ca``; subject CN = node id and nothing else; CA:FALSE; key usage digitalSignature (no
    keyCertSign, cRLSign); extended key usage clientAuth only; the CSR's public key; valid now, and within the
    validity asked (``tolerance`` either way, for a signer that rounds).
    """
    wrong = []
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        wrong.append("it is not issued by the CA in ca.pem")
    subject = [(a.oid, a.value) for a in cert.subject]
    if subject != [(NameOID.COMMON_NAME, req.node_id)]:
        wrong.append(f"its subject is {cert.subject.rfc4514_string()!r}, not CN={req.node_id}")
    ext = cert.extensions
    try:
        if ext.get_extension_for_class(x509.BasicConstraints).value.ca:
            wrong.append("it is a CA certificate (CA:TRUE)")
    except x509.ExtensionNotFound:
        wrong.append("it has no basicConstraints CA:FALSE")
    try:
        usage = ext.get_extension_for_class(x509.KeyUsage).value
        if not usage.digital_signature or usage.key_cert_sign or usage.crl_sign:
            wrong.append("its key usage is not digitalSignature (without keyCertSign or cRLSign)")
    except x509.ExtensionNotFound:
        wrong.append("it has no key usage")
    try:
        purposes = list(ext.get_extension_for_class(x509.ExtendedKeyUsage).value)
        if purposes != [ExtendedKeyUsageOID.CLIENT_AUTH]:
            wrong.append("its extended key usage is not clientAuth only")
    except x509.ExtensionNotFound:
        wrong.append("it has no extended key usage clientAuth")
    try:
        asked = x509.load_pem_x509_csr(req.csr_pem.encode()).public_key()
        if cert.public_key() != asked:
            wrong.append("its public key is not the one the request was made for")
    except ValueError:
        wrong.append("the request's public key cannot be read")
    if cert.not_valid_before_utc < req.not_before - tolerance or cert.not_valid_after_utc > req.not_after + tolerance:
        wrong.append(f"its validity ({cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M}) "
                     f"is not within the one asked ({req.not_before:%Y-%m-%d %H:%M} to {req.not_after:%Y-%m-%d %H:%M})")
    elif not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        wrong.append("it is not valid now")
    return wrong


def accept_signed(ca: x509.Certificate, returned: str, req: SigningRequest, now: dt.datetime) -> IssuedCertificate:
    """The first certificate of what a signer printed, once ``signed_problems`` finds nothing wrong with it."""
    start = returned.find("-----BEGIN CERTIFICATE-----")
    end = returned.find("-----END CERTIFICATE-----", start)
    try:
        if start < 0 or end < 0:
            raise ValueError
        text = returned[start:end + len("-----END CERTIFICATE-----")] + "\n"
        cert = x509.load_pem_x509_certificate(text.encode())
    except ValueError:
        raise SignedCertificateError(req.node_id, "the signer printed no readable PEM certificate") from None
    wrong = signed_problems(ca, cert, req, now)
    if wrong:
        raise SignedCertificateError(req.node_id, "the signer returned a certificate that is refused: "
                                     + "; ".join(wrong))
    return described(cert)
