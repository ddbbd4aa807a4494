"""The policy every key and node certificate must meet, as pure functions of what is checked.

- ``key_problem``: only P-256, P-384, P-521, Ed25519 and RSA of at least
  ``MIN_RSA_BITS`` bits are signed for;
- ``check_node_certificate``: a node certificate is signed by the cluster CA,
  its subject is exactly CN = node id, it certifies the key asked for, carries
  BasicConstraints CA:FALSE (critical), KeyUsage digitalSignature only
  (critical), ExtendedKeyUsage clientAuth only, the key identifiers and no
  other extension (no subjectAltName), and is valid now and no longer than
  its CA (and than the validity asked);
- ``request_problems`` / ``requested_key``: a node's CSR asks for exactly
  that subject and nothing else (no extension or other attribute), is signed
  by its own key with a hash that is not broken, for a key the policy allows;
  a request that is not is refused before any signer sees it.

llmgw_pulumi.certificates.pki issues and adopts certificates with it; a certificate another signer made is checked the same way.
"""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from ..config.signer import CLOCK_SKEW
from ..errors import CertificateRequestError


def sign_hash(key: object) -> hashes.HashAlgorithm | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey
"""The public keys a node's key pair may have (and ``key_problem`` narrows further)."""


CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}
"""The elliptic curves signed for, by the name cryptography gives them: the NIST prime curves of 256 bits and more."""


MIN_RSA_BITS = 2048


KEY_FIX = ("give the node a P-256, P-384 or P-521 (ECDSA), Ed25519, or RSA key of at least 2048 bits: "
           "`pulumi up --replace` on its ClientCertificate has node-key.sh make a P-256 pair")


def key_problem(key: object) -> str | None:
    """None for a public key this CA signs for; otherwise what the key is, and why it is not signed for."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name in CURVES:
            return None
        return f"an EC key on curve {key.curve.name}, which is not one of P-256, P-384, P-521"
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size >= MIN_RSA_BITS:
            return None
        return f"an RSA key of {key.key_size} bits, fewer than {MIN_RSA_BITS}"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return None
    kind = type(key).__name__.removesuffix("PublicKey").lstrip("_") or "unknown"
    return f"a {kind} key, which is not one of P-256, P-384, P-521, Ed25519 or RSA"


OTHER_KEY_USAGES = ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement", "key_cert_sign",
                    "crl_sign")
"""KeyUsage bits a node certificate must not have (``encipher_only``/``decipher_only`` need ``key_agreement``)."""


KNOWN_CRITICAL = (ExtensionOID.BASIC_CONSTRAINTS, ExtensionOID.KEY_USAGE, ExtensionOID.EXTENDED_KEY_USAGE)
"""Extensions a node certificate may mark critical: a verifier must refuse a critical extension it does not know."""


ALLOWED_EXTENSIONS = (*KNOWN_CRITICAL, ExtensionOID.SUBJECT_KEY_IDENTIFIER, ExtensionOID.AUTHORITY_KEY_IDENTIFIER)
"""The only extensions a node certificate may carry: the three above, and the key identifiers that tie it to its
key and its CA (what ``issue`` and llmgw_pulumi.certificates.signer's EXTENSIONS add). A subjectAltName or any other is refused."""


WEAK_HASHES = (hashes.SHA1, hashes.MD5)


PURPOSE_NAMES = {
    ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth", ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
    ExtendedKeyUsageOID.CODE_SIGNING: "codeSigning", ExtendedKeyUsageOID.EMAIL_PROTECTION: "emailProtection",
    ExtendedKeyUsageOID.TIME_STAMPING: "timeStamping", ExtendedKeyUsageOID.OCSP_SIGNING: "OCSPSigning",
    ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE: "anyExtendedKeyUsage",
}
"""How OpenSSL names the extended key usages a problem may mention; any other is shown by its OID."""


def _extension(extensions: x509.Extensions, kind: type[x509.ExtensionType]) -> x509.Extension[x509.ExtensionType] | None:
    try:
        return extensions.get_extension_for_class(kind)
    except x509.ExtensionNotFound:
        return None


def _extension_problems(extensions: x509.Extensions) -> list[str]:
    """BasicConstraints CA:FALSE (critical), KeyUsage digitalSignature only (critical), ExtendedKeyUsage clientAuth
    only, and no other critical extension."""
    problems = []
    constraints = _extension(extensions, x509.BasicConstraints)
    if constraints is None:
        problems.append("it has no BasicConstraints extension (CA:FALSE)")
    else:
        if constraints.value.ca:  # type: ignore[attr-defined]
            problems.append("its BasicConstraints say CA:TRUE: it could sign certificates")
        if not constraints.critical:
            problems.append("its BasicConstraints extension is not critical")
    usage = _extension(extensions, x509.KeyUsage)
    if usage is None:
        problems.append("it has no KeyUsage extension (digitalSignature)")
    else:
        if not usage.value.digital_signature:  # type: ignore[attr-defined]
            problems.append("its KeyUsage does not allow digitalSignature")
        extra = [name for name in OTHER_KEY_USAGES if getattr(usage.value, name)]
        if extra:
            problems.append(f"its KeyUsage also allows {', '.join(extra)}")
        if not usage.critical:
            problems.append("its KeyUsage extension is not critical")
    purposes = _extension(extensions, x509.ExtendedKeyUsage)
    if purposes is None:
        problems.append("it has no ExtendedKeyUsage extension (clientAuth)")
    elif list(purposes.value) != [ExtendedKeyUsageOID.CLIENT_AUTH]:  # type: ignore[call-overload]
        names = ", ".join(PURPOSE_NAMES.get(oid, oid.dotted_string) for oid in purposes.value)  # type: ignore[attr-defined]
        problems.append(f"its ExtendedKeyUsage is {names or 'empty'}, not clientAuth only")
    unknown = [ext.oid.dotted_string for ext in extensions if ext.critical and ext.oid not in KNOWN_CRITICAL]
    if unknown:
        problems.append(f"it has critical extensions this policy does not know: {', '.join(unknown)}")
    other = [extension_name(ext) for ext in extensions if ext.oid not in ALLOWED_EXTENSIONS]
    if other:
        problems.append(f"it has extensions a node certificate must not have: {', '.join(other)}")
    return problems


def extension_name(ext: x509.Extension[x509.ExtensionType]) -> str:
    """An extension by cryptography's name of its kind (SubjectAlternativeName), or by its OID when unknown."""
    if isinstance(ext.value, x509.UnrecognizedExtension):
        return ext.oid.dotted_string
    return f"{type(ext.value).__name__} ({ext.oid.dotted_string})"


def subject_problem(subject: x509.Name, node_id: str) -> str | None:
    """None when ``subject`` is exactly CN=<node id> (one attribute); otherwise what it is instead."""
    attributes = [attribute for rdn in subject.rdns for attribute in rdn]
    if len(attributes) == 1 and attributes[0].oid == NameOID.COMMON_NAME and attributes[0].value == node_id:
        return None
    shown = subject.rfc4514_string() or "empty"
    return f"its subject is {shown!r}, not exactly 'CN={node_id}'"


def _validity_problems(cert: x509.Certificate, ca: x509.Certificate, now: dt.datetime,
                       validity: dt.timedelta | None) -> list[str]:
    problems = []
    begins, ends = cert.not_valid_before_utc, cert.not_valid_after_utc
    if begins > now + CLOCK_SKEW:
        problems.append(f"it is not valid before {begins:%Y-%m-%d %H:%M:%S} UTC (now {now:%Y-%m-%d %H:%M:%S})")
    if ends <= now:
        problems.append(f"it expired on {ends:%Y-%m-%d %H:%M:%S} UTC")
    if ends > ca.not_valid_after_utc:
        problems.append(f"it is valid until {ends:%Y-%m-%d %H:%M:%S} UTC, after its CA "
                        f"({ca.not_valid_after_utc:%Y-%m-%d %H:%M:%S})")
    if validity is not None and ends > now + validity + CLOCK_SKEW:
        problems.append(f"it is valid until {ends:%Y-%m-%d %H:%M:%S} UTC, longer than the "
                        f"{validity.total_seconds() / 3600:g} h asked")
    return problems


def check_node_certificate(cert: x509.Certificate, ca: x509.Certificate, node_id: str, public_key: object | None,
                           now: dt.datetime, validity: dt.timedelta | None = None) -> list[str]:
    """What is wrong with ``cert`` as the client certificate of ``node_id``: [] when nothing is.

    Pure: the policy of every node certificate, whoever signed it. It must be
    signed by ``ca`` (ca.pem), have the subject CN=``node_id`` and nothing
    else, certify ``public_key`` (the key requested; None: any key) with a key the
    policy allows (``key_problem``), carry BasicConstraints CA:FALSE
    (critical), KeyUsage digitalSignature only (critical) and
    ExtendedKeyUsage clientAuth only, no extension but ALLOWED_EXTENSIONS, use
    no SHA-1/MD5 signature, be valid at ``now`` (it may begin up to
    CLOCK_SKEW later: its signer's clock may be that far ahead) and end no
    later than its CA (and, with ``validity``, than ``now + validity +
    CLOCK_SKEW``).
    """
    problems = []
    try:
        digest = cert.signature_hash_algorithm
    except UnsupportedAlgorithm:
        digest = None
    if isinstance(digest, WEAK_HASHES):
        problems.append(f"it is signed with {digest.name}, which is broken")  # and cannot be verified here at all
    else:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
            problems.append(f"it is not signed by the cluster CA ({ca.subject.rfc4514_string()})")
    if cert.version != x509.Version.v3:
        problems.append(f"it is an X.509 {cert.version.name} certificate, not v3")
    names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [node_id]:
        problems.append(f"its common name is {', '.join(map(repr, names)) or 'missing'}, not {node_id!r}")
    else:
        extra = subject_problem(cert.subject, node_id)
        if extra:
            problems.append(extra)
    try:
        key: object = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        problems.append("its public key cannot be read")
    else:
        weak = key_problem(key)
        if weak:
            problems.append(f"its key is {weak}")
        if public_key is not None and key != public_key:
            problems.append("its key is not the key it was asked for")
    try:
        extensions = cert.extensions
    except ValueError:
        problems.append("its extensions cannot be parsed (one is given twice, or malformed)")
    else:
        problems += _extension_problems(extensions)
    return problems + _validity_problems(cert, ca, now, validity)


EXTENSION_REQUEST = x509.ObjectIdentifier("1.2.840.113549.1.9.14")
"""PKCS#9 extensionRequest: the attribute that carries a request's extensions (named by ``request_problems`` as
extensions)."""


def request_problems(csr: x509.CertificateSigningRequest, node_id: str) -> list[str]:
    """What is wrong with ``csr`` as the request of ``node_id``: [] when nothing is (its key is judged apart).

    Pure. A request asks for the subject CN=<node id> and nothing else: no
    other subject attribute, no extension (a subjectAltName, a usage) and no
    other attribute; it is signed by its own key, with a hash that is not
    broken. A signer that signs verbatim would otherwise issue what the node
    asked for.
    """
    problems = []
    extra = subject_problem(csr.subject, node_id)
    if extra:
        problems.append(extra)
    try:
        extensions = [extension_name(ext) for ext in csr.extensions]
    except ValueError:
        extensions = ["(extensions that cannot be parsed)"]
    if extensions:
        problems.append(f"it asks for extensions: {', '.join(extensions)}")
    others = [attribute.oid.dotted_string for attribute in csr.attributes if attribute.oid != EXTENSION_REQUEST]
    if others:
        problems.append(f"it carries attributes: {', '.join(others)}")
    try:
        digest = csr.signature_hash_algorithm
    except UnsupportedAlgorithm:
        digest = None
    if isinstance(digest, WEAK_HASHES):
        problems.append(f"it is signed with {digest.name}, which is broken")
    elif not _signed_by_its_key(csr):
        problems.append("it is not signed by its own key")
    return problems


def _signed_by_its_key(csr: x509.CertificateSigningRequest) -> bool:
    try:
        return csr.is_signature_valid
    except (ValueError, UnsupportedAlgorithm):  # a signature algorithm this library cannot check
        return False


REQUEST_FIX = ("have the node make a new request for CN=<node id> alone: `pulumi up --replace` on its "
               "ClientCertificate runs node-key.sh again; if the node made this request itself, treat it as "
               "compromised")


def requested_key(csr_pem: str, node_id: str) -> PublicKey:
    """The public key of the CSR a node made for itself, once the request meets the policy
    (``request_problems``) and the policy allows its kind of key (``key_problem``).

    Called before any signer sees the request: a request for anything else is
    refused here (CertificateRequestError), so no signer ever signs it.
    """
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
    except ValueError:
        raise CertificateRequestError(node_id, "the node returned something that is not a PEM certificate signing request") from None
    try:
        key = csr.public_key()
    except (ValueError, UnsupportedAlgorithm):  # cryptography raises ValueError for a key type it does not know
        raise CertificateRequestError(node_id, "the node's key is of a kind this policy does not know", KEY_FIX) from None
    problems = request_problems(csr, node_id)
    if problems:
        raise CertificateRequestError(node_id, "the node's certificate signing request is refused: "
                                      + "; ".join(problems), REQUEST_FIX)
    refuse_weak(key, node_id, "the node's key")
    return key  # type: ignore[return-value]


def refuse_weak(key: object, node_id: str, whose: str) -> None:
    """Refuse to sign for a key the policy does not allow (``key_problem``)."""
    weak = key_problem(key)
    if weak:
        raise CertificateRequestError(node_id, f"{whose} is {weak}: it is not signed for", KEY_FIX)
