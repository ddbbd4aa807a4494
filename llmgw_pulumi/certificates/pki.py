"""Issuing node identities from the cluster CA, and the policy every node certificate must meet.

``issue`` is a pure function of the authority, the node id, the validity and a
clock; ``load_authority`` is the only thing here that reads files, and it reads
them on the machine running Pulumi: the CA key never goes anywhere else, and
never into state (it is read from the PKI dir at issue time, not passed as an
input; its passphrase, when it is encrypted, is a secret input).

The policy is written once, as pure functions of what is checked, in llmgw_pulumi.certificates.policy
(``key_problem``, ``check_node_certificate``, ``requested_key``).

``issue`` checks what it just signed with it; ``adoptable`` checks the
certificate a node already holds with it before keeping that certificate. A
certificate made anywhere else (another signer) is checked the same way,
against ca.pem, the node id, the public key requested and the validity asked.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..config.signer import CLOCK_SKEW, SigningRequest
from ..errors import AuthorityError, CertificatePolicyError, SignedCertificateError
from .policy import KEY_FIX as KEY_FIX
from .policy import MIN_RSA_BITS as MIN_RSA_BITS
from .policy import PublicKey as PublicKey
from .policy import check_node_certificate as check_node_certificate
from .policy import key_problem as key_problem
from .policy import refuse_weak, sign_hash
from .policy import requested_key as requested_key

log = logging.getLogger(__name__)

CA_PASSPHRASE_SETTING = "llmgw:caKeyPassphrase"
"""The stack-config secret holding the passphrase of an encrypted ca-key.pem (named in fix texts)."""


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


def _ca_problem(cert: x509.Certificate) -> str | None:
    """Why ``cert`` cannot be the cluster CA: it is not CA:TRUE, or its KeyUsage forbids signing certificates."""
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return "has no BasicConstraints extension, so it is not a CA certificate (CA:TRUE)"
    if not constraints.ca:
        return "is not a CA certificate (its BasicConstraints say CA:FALSE)"
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if not usage.key_cert_sign:
        return "is a CA certificate whose KeyUsage does not allow signing certificates (keyCertSign)"
    return None


def _read_ca_key(key_path: Path, node: str, passphrase: str | None) -> object:
    """The CA's private key from ``key_path``, decrypted with ``passphrase`` when it is encrypted.

    Errors name the file and the setting, never a byte of the key or of the
    passphrase (cryptography's own messages are not passed on).
    """
    data = key_path.read_bytes()
    encrypted = b"ENCRYPTED" in data  # PKCS#8 "ENCRYPTED PRIVATE KEY", or a legacy "Proc-Type: 4,ENCRYPTED" header
    if encrypted and passphrase is None:
        raise AuthorityError(node, f"{key_path} is encrypted, and no passphrase for it is configured",
                             f"set it as a secret: `pulumi config set --secret {CA_PASSPHRASE_SETTING}` "
                             "(NodeArgs.ca_key_passphrase, in a program of your own)")
    if not encrypted and passphrase is not None:
        raise AuthorityError(node, f"{key_path} is not encrypted, yet {CA_PASSPHRASE_SETTING} is set",
                             f"remove the secret (`pulumi config rm {CA_PASSPHRASE_SETTING}`), or encrypt the key: "
                             f"`openssl pkey -in {key_path} -aes256 -out ca-key.enc.pem`, then move it over ca-key.pem")
    try:
        return serialization.load_pem_private_key(data, password=passphrase.encode() if passphrase is not None else None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        if encrypted:
            raise AuthorityError(node, f"{key_path} cannot be decrypted with the configured passphrase",
                                 f"fix the {CA_PASSPHRASE_SETTING} secret") from None
        # The exception text may quote key bytes; say only which file it was.
        raise AuthorityError(node, f"{key_path} is not a PEM private key") from None


def load_authority(pki_dir: str, node: str, now: dt.datetime | None = None, passphrase: str | None = None) -> Authority:
    """Read ca.pem and ca-key.pem from the PKI dir and check they can issue today.

    ca.pem must be a CA certificate (CA:TRUE); ca-key.pem must be readable by
    its owner only, and is decrypted with ``passphrase`` when it is encrypted.
    """
    now = now or dt.datetime.now(dt.UTC)
    d = Path(pki_dir)
    cert_path, key_path = d / "ca.pem", d / "ca-key.pem"
    if not cert_path.is_file() or not key_path.is_file():
        missing = ", ".join(p.name for p in (cert_path, key_path) if not p.is_file())
        raise AuthorityError(node, f"no authority in {pki_dir} ({missing} missing); create one first")
    mode = stat.S_IMODE(key_path.stat().st_mode)
    if mode & 0o077:
        raise AuthorityError(node, f"{key_path} is open to group or others (mode {mode:04o}): the CA key must be readable "
                             "by its owner only", f"chmod 600 {key_path}")
    if not os.access(key_path, os.R_OK):
        raise AuthorityError(node, f"cannot read {key_path}",
                             "run Pulumi as a user that may read the CA key (only the CA host can issue identities)")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as exc:
        raise AuthorityError(node, f"{cert_path} is not a PEM certificate") from exc
    not_a_ca = _ca_problem(cert)
    if not_a_ca:
        raise AuthorityError(node, f"{cert_path} {not_a_ca}",
                             "point llmgw:pkiDir at the cluster CA that `llmgw ctl cert init-ca` made (its ca.pem is "
                             "CA:TRUE); a node certificate cannot issue identities")
    key = _read_ca_key(key_path, node, passphrase)
    if not _signs(cert, key):
        raise AuthorityError(node, f"{key_path.name} does not belong to {cert_path.name} in {pki_dir}",
                             "restore the matching pair from backup; a CA key that does not match its certificate cannot issue identities")
    _check_authority(cert, None, f"in {pki_dir}", node, now)
    return Authority(cert=cert, key=key)


# CLOCK_SKEW (from llmgw_pulumi.certificates.signer): how far a node's clock may be behind: certificates start this much in the
# past (and a signer's clock may be this much ahead of ours).


def issue(authority: Authority, node_id: str, validity: dt.timedelta, now: dt.datetime,
          public_key: PublicKey | None = None) -> IssuedCertificate:
    """A fresh client certificate for ``node_id`` (CN = node id, clientAuth), signed by the CA.

    With ``public_key`` (from the node's CSR, see ``requested_key``) the
    certificate is issued for it and no key is made here (``key_pem`` is
    empty); without, a new P-256 key pair is made here (keyOrigin operator).
    Validity is capped at the CA's own expiry: a leaf that outlives its issuer
    would fail verification anyway, later and more confusingly. What was
    signed is checked against the policy (``check_node_certificate``) before
    it is returned.
    """
    key = None if public_key is not None else ec.generate_private_key(ec.SECP256R1())
    subject_key = public_key if public_key is not None else key.public_key()  # type: ignore[union-attr]
    refuse_weak(subject_key, node_id, "the key to certify")
    not_before = now - CLOCK_SKEW  # tolerate small clock skew on the node
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
        .sign(authority.key, sign_hash(authority.key))  # type: ignore[arg-type]
    )
    problems = check_node_certificate(cert, authority.cert, node_id, subject_key, now, validity)
    if problems:
        raise CertificatePolicyError(node_id, "the certificate just signed breaks the node certificate policy: "
                                     + "; ".join(problems))
    key_pem = "" if key is None else key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return dataclasses.replace(described(cert), key_pem=key_pem)


# --------------------------------------------------------------------------- the node certificate policy


def verify_issued(ca_pem: str, cert_pem: str) -> bool:
    """Was cert_pem signed by the CA in ca_pem? (How a test checks what a node holds.)"""
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def spki_b64(cert_pem: str) -> str:
    """The certificate's public key as base64 of its DER SubjectPublicKeyInfo: how node-key.sh prints a key's."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


def described(cert: x509.Certificate) -> IssuedCertificate:
    """An issued certificate's record (no key: it stays where it was made), its PEM re-encoded from the parsed
    certificate: one block, nothing before or after it."""
    return IssuedCertificate(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        key_pem="",
        serial=format(cert.serial_number, "x"),
        not_after=cert.not_valid_after_utc.isoformat(),
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
    )


def adoptable(authority: Authority, node_id: str, cert_pem: str | None, key_spki: str, renew_before: dt.timedelta,
              now: dt.datetime) -> IssuedCertificate | None:
    """The identity a node already holds, when it can be kept as it is: None when a new one must be issued.

    Kept when the certificate meets the node certificate policy
    (``check_node_certificate``: this CA, CN = node id, CA:FALSE, clientAuth
    only, digitalSignature, valid now and not beyond the CA, a strong key) for
    the node's key (``key_spki``, its public half as node-key.sh prints it), and
    is not yet in the renewal window. This is how the first `pulumi up` over a
    node that onboard-node.sh onboarded takes it over without re-issuing. The
    record holds the certificate re-encoded from its parsed form, never the
    node's text (which may carry more after it): installing it again rewrites
    a file that is the certificate alone, and leaves one that is.
    """
    if not cert_pem or not key_spki:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        node_key = serialization.load_der_public_key(base64.b64decode(key_spki, validate=True))
    except (ValueError, TypeError, UnsupportedAlgorithm, binascii.Error):
        return None
    problems = check_node_certificate(cert, authority.cert, node_id, node_key, now)
    if problems:
        log.warning("%s: the certificate on the node is not kept (%s); a new key pair is made there and signed",
                    node_id, "; ".join(problems))
        return None
    if cert.not_valid_after_utc - renew_before <= now:
        return None
    return described(cert)


# --------------------------------------------------------------------------- signers (llmgw_pulumi.certificates.signer)


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
    not_a_ca = _ca_problem(cert)
    if not_a_ca:
        raise AuthorityError(node, f"llmgw:signer.ca {not_a_ca}", "give the cluster CA's certificate (CA:TRUE)")
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


def signed_problems(ca: x509.Certificate, cert: x509.Certificate, req: SigningRequest, now: dt.datetime) -> list[str]:
    """What is wrong with the certificate a signer returned for ``req``: empty when it is the one asked for.

    The policy of every node certificate (``check_node_certificate``: issued by ``ca``, CN = node id, CA:FALSE,
    digitalSignature, clientAuth only, valid now) for the request's public key, ending no later than asked, and
    starting no earlier than asked (CLOCK_SKEW either way, for a signer that rounds).
    """
    try:
        asked: object | None = x509.load_pem_x509_csr(req.csr_pem.encode()).public_key()
    except ValueError:
        asked = None
    wrong = check_node_certificate(cert, ca, req.node_id, asked, now, validity=req.not_after - now)
    if asked is None:
        wrong.append("the request's public key cannot be read")
    if cert.not_valid_before_utc < req.not_before - CLOCK_SKEW:
        wrong.append(f"it starts {cert.not_valid_before_utc:%Y-%m-%d %H:%M}, before the start asked "
                     f"({req.not_before:%Y-%m-%d %H:%M})")
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
