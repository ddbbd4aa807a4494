"""Certificate issuance from the cluster CA (CN = node id, clientAuth, capped validity, clear CA errors) and the policy
every node certificate is held to, whoever signed it (pki.check_node_certificate)."""

import base64
import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab import pki as labpki
from llmgw_pulumi.certificates import pki, policy
from llmgw_pulumi.errors import AuthorityError, CertificatePolicyError, CertificateRequestError, SignedCertificateError
from tests.unit import fake_pem
from tests.unit.error_checks import assert_refused

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def ca(tmp_path):
    labpki.init_ca(tmp_path)
    return tmp_path


def test_issued_certificate_is_the_node_identity(ca):
    auth = pki.load_authority(str(ca), "gpu-01")
    issued = pki.issue(auth, "gpu-01", dt.timedelta(hours=24), NOW)
    cert = x509.load_pem_x509_certificate(issued.cert_pem.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-01"
    assert ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert pki.verify_issued(auth.cert_pem, issued.cert_pem)
    assert int(issued.serial, 16) == cert.serial_number
    key = serialization.load_pem_private_key(issued.key_pem.encode(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    assert "PRIVATE" not in repr(issued)


def test_each_issue_is_fresh(ca):
    auth = pki.load_authority(str(ca), "n")
    a, b = (pki.issue(auth, "n", dt.timedelta(hours=1), NOW) for _ in range(2))
    assert a.serial != b.serial and a.key_pem != b.key_pem


def test_validity_is_capped_at_the_ca_expiry(ca):
    auth = pki.load_authority(str(ca), "n")
    issued = pki.issue(auth, "n", dt.timedelta(days=100000), NOW)
    assert dt.datetime.fromisoformat(issued.not_after) == auth.cert.not_valid_after_utc


def test_missing_ca_says_how_to_create_one(tmp_path):
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(tmp_path), "gpu-01")
    text = str(err.value)
    assert f"no authority in {tmp_path}" in text and "create one first" in text
    assert "llmgw ctl cert init-ca" in text and text.startswith("gpu-01: ")


def test_ca_key_that_does_not_match_its_certificate(ca):
    other = ec.generate_private_key(ec.SECP256R1())
    (ca / "ca-key.pem").write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    with pytest.raises(AuthorityError, match="does not belong to ca.pem"):
        pki.load_authority(str(ca), "gpu-01")


def test_expired_ca(ca):
    with pytest.raises(AuthorityError, match="expired"):
        pki.load_authority(str(ca), "gpu-01", now=NOW + dt.timedelta(days=365 * 20))


def test_garbage_key_file_is_named_not_quoted(ca):
    (ca / "ca-key.pem").write_text(fake_pem("PRIVATE KEY", "TOPSECRETBYTES"))
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), "gpu-01")
    assert "TOPSECRETBYTES" not in str(err.value) and "ca-key.pem" in str(err.value)


# --------------------------------------------------------------------------- the node certificate policy
#
# Every certificate and request below is built here, with cryptography (or the openssl CLI), from the test's own
# choices; what the policy must say about each is written out in full, never computed by llmgw_pulumi.certificates.pki.

NODE = "gpu-01"
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmgw test CA")])
NODE_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)])
ONLY_DIGITAL_SIGNATURE = dict(digital_signature=True, content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                              encipher_only=False, decipher_only=False)


def when(text: str) -> str:
    return f"{text:%Y-%m-%d %H:%M:%S}" if isinstance(text, dt.datetime) else text


@pytest.fixture(scope="module")
def test_ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA made here: P-256, CA:TRUE, ten years from an hour ago (to the second)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = NOW.replace(microsecond=0) - dt.timedelta(hours=1)
    cert = (x509.CertificateBuilder().subject_name(CA_NAME).issuer_name(CA_NAME).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(**{**ONLY_DIGITAL_SIGNATURE, "key_cert_sign": True, "crl_sign": True}),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


@pytest.fixture(scope="module")
def node_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def node_cert(ca: tuple[x509.Certificate, Any], key: Any, *, name: x509.Name = NODE_NAME,
              not_before: dt.datetime | None = None, not_after: dt.datetime | None = None,
              constraints: tuple[x509.BasicConstraints, bool] | None = (x509.BasicConstraints(ca=False, path_length=None), True),
              usage: tuple[x509.KeyUsage, bool] | None = (x509.KeyUsage(**ONLY_DIGITAL_SIGNATURE), True),
              purposes: list[x509.ObjectIdentifier] | None = [ExtendedKeyUsageOID.CLIENT_AUTH],  # noqa: B006
              extra: list[tuple[x509.ExtensionType, bool]] = ()) -> x509.Certificate:  # type: ignore[assignment]
    """A node certificate as a conforming signer makes it, but for what the arguments change."""
    ca_cert, ca_key = ca
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(not_before or NOW - dt.timedelta(minutes=5))
               .not_valid_after(not_after or NOW + dt.timedelta(days=30)))
    if constraints is not None:
        builder = builder.add_extension(*constraints)
    if usage is not None:
        builder = builder.add_extension(*usage)
    if purposes is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(purposes), critical=False)
    for ext, critical in extra:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(ca_key, hashes.SHA256())


def test_a_conforming_certificate_has_no_problems(test_ca, node_key) -> None:
    cert = node_cert(test_ca, node_key)
    assert pki.check_node_certificate(cert, test_ca[0], NODE, node_key.public_key(), NOW) == []
    assert pki.check_node_certificate(cert, test_ca[0], NODE, None, NOW, dt.timedelta(days=30)) == []


@pytest.mark.parametrize("change, problems", [
    ({"constraints": (x509.BasicConstraints(ca=True, path_length=None), True)},
     ["its BasicConstraints say CA:TRUE: it could sign certificates"]),
    ({"constraints": (x509.BasicConstraints(ca=False, path_length=None), False)},
     ["its BasicConstraints extension is not critical"]),
    ({"constraints": None}, ["it has no BasicConstraints extension (CA:FALSE)"]),
    ({"usage": (x509.KeyUsage(**{**ONLY_DIGITAL_SIGNATURE, "digital_signature": False, "key_encipherment": True}), True)},
     ["its KeyUsage does not allow digitalSignature", "its KeyUsage also allows key_encipherment"]),
    ({"usage": (x509.KeyUsage(**{**ONLY_DIGITAL_SIGNATURE, "key_cert_sign": True, "crl_sign": True}), True)},
     ["its KeyUsage also allows key_cert_sign, crl_sign"]),
    ({"usage": (x509.KeyUsage(**{**ONLY_DIGITAL_SIGNATURE, "content_commitment": True, "data_encipherment": True,
                                 "key_agreement": True}), True)},
     ["its KeyUsage also allows content_commitment, data_encipherment, key_agreement"]),
    ({"usage": (x509.KeyUsage(**ONLY_DIGITAL_SIGNATURE), False)}, ["its KeyUsage extension is not critical"]),
    ({"usage": None}, ["it has no KeyUsage extension (digitalSignature)"]),
    ({"purposes": [ExtendedKeyUsageOID.SERVER_AUTH]}, ["its ExtendedKeyUsage is serverAuth, not clientAuth only"]),
    ({"purposes": [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]},
     ["its ExtendedKeyUsage is clientAuth, serverAuth, not clientAuth only"]),
    ({"purposes": [ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE]},
     ["its ExtendedKeyUsage is anyExtendedKeyUsage, not clientAuth only"]),
    ({"purposes": None}, ["it has no ExtendedKeyUsage extension (clientAuth)"]),
    ({"extra": [(x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.55555.1"), b"\x05\x00"), True)]},
     ["it has critical extensions this policy does not know: 1.3.6.1.4.1.55555.1",
      "it has extensions a node certificate must not have: 1.3.6.1.4.1.55555.1"]),
    ({"extra": [(x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.55555.1"), b"\x05\x00"), False)]},
     ["it has extensions a node certificate must not have: 1.3.6.1.4.1.55555.1"]),
    ({"extra": [(x509.SubjectAlternativeName([x509.DNSName("gpu-02")]), False)]},
     ["it has extensions a node certificate must not have: SubjectAlternativeName (2.5.29.17)"]),
    ({"extra": [(x509.SubjectKeyIdentifier.from_public_key(ec.generate_private_key(ec.SECP256R1()).public_key()), False)]}, []),
    ({"name": x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ops"), x509.NameAttribute(NameOID.COMMON_NAME, NODE)])},
     ["its subject is 'CN=gpu-01,O=ops', not exactly 'CN=gpu-01'"]),
    ({"name": x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-02")])}, ["its common name is 'gpu-02', not 'gpu-01'"]),
    ({"name": x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE), x509.NameAttribute(NameOID.COMMON_NAME, "x")])},
     ["its common name is 'gpu-01', 'x', not 'gpu-01'"]),
    ({"name": x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODE)])}, ["its common name is missing, not 'gpu-01'"]),
], ids=["CA:TRUE", "constraints not critical", "no constraints", "no digitalSignature", "keyCertSign", "other usages",
        "usage not critical", "no usage", "serverAuth", "clientAuth and serverAuth", "any usage", "no extended usage",
        "unknown critical extension", "unknown extension not critical", "a SAN", "a key identifier", "O= too",
        "another CN", "two CNs", "no CN"])
def test_each_breach_of_the_policy_is_named(test_ca, node_key, change, problems) -> None:
    cert = node_cert(test_ca, node_key, **change)
    assert pki.check_node_certificate(cert, test_ca[0], NODE, node_key.public_key(), NOW) == problems


def test_the_validity_must_hold_now_and_end_with_the_ca_and_the_validity_asked(test_ca, node_key) -> None:
    ca = test_ca[0]
    soon = NOW.replace(microsecond=0) + dt.timedelta(hours=1)
    early = node_cert(test_ca, node_key, not_before=soon)
    assert pki.check_node_certificate(early, ca, NODE, None, NOW) == [
        f"it is not valid before {when(soon)} UTC (now {when(NOW)})"]
    # A signer's clock may be up to five minutes ahead of ours: a certificate may begin that much later.
    nearly_now = (NOW + dt.timedelta(minutes=4)).replace(microsecond=0)
    assert pki.check_node_certificate(node_cert(test_ca, node_key, not_before=nearly_now), ca, NODE, None, NOW) == []
    later = (NOW + dt.timedelta(minutes=6)).replace(microsecond=0)
    assert pki.check_node_certificate(node_cert(test_ca, node_key, not_before=later), ca, NODE, None, NOW) == [
        f"it is not valid before {when(later)} UTC (now {when(NOW)})"]
    ended = NOW.replace(microsecond=0) - dt.timedelta(minutes=1)
    expired = node_cert(test_ca, node_key, not_before=ended - dt.timedelta(days=1), not_after=ended)
    assert pki.check_node_certificate(expired, ca, NODE, None, NOW) == [f"it expired on {when(ended)} UTC"]
    beyond = ca.not_valid_after_utc + dt.timedelta(seconds=1)
    assert pki.check_node_certificate(node_cert(test_ca, node_key, not_after=beyond), ca, NODE, None, NOW) == [
        f"it is valid until {when(beyond)} UTC, after its CA ({when(ca.not_valid_after_utc)})"]
    at_the_ca = node_cert(test_ca, node_key, not_after=ca.not_valid_after_utc)
    assert pki.check_node_certificate(at_the_ca, ca, NODE, None, NOW) == []
    # The validity asked (24 h), give or take the five minutes a signer's clock may be ahead.
    asked = dt.timedelta(hours=24)
    within = (NOW + asked + dt.timedelta(minutes=4)).replace(microsecond=0)
    assert pki.check_node_certificate(node_cert(test_ca, node_key, not_after=within), ca, NODE, None, NOW, asked) == []
    longer = (NOW + asked + dt.timedelta(minutes=6)).replace(microsecond=0)
    assert pki.check_node_certificate(node_cert(test_ca, node_key, not_after=longer), ca, NODE, None, NOW, asked) == [
        f"it is valid until {when(longer)} UTC, longer than the 24 h asked"]


def test_another_signer_another_key_or_a_weak_key_is_named(test_ca, node_key) -> None:
    other_ca = (test_ca[0], ec.generate_private_key(ec.SECP256R1()))  # the same name, another key
    cert = node_cert(other_ca, node_key)
    assert pki.check_node_certificate(cert, test_ca[0], NODE, node_key.public_key(), NOW) == [
        "it is not signed by the cluster CA (CN=llmgw test CA)"]
    someone_else = ec.generate_private_key(ec.SECP256R1()).public_key()
    assert pki.check_node_certificate(node_cert(test_ca, node_key), test_ca[0], NODE, someone_else, NOW) == [
        "its key is not the key it was asked for"]
    small = rsa.generate_private_key(65537, 1024)
    assert pki.check_node_certificate(node_cert(test_ca, small), test_ca[0], NODE, small.public_key(), NOW) == [
        "its key is an RSA key of 1024 bits, fewer than 2048"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.mark.parametrize("digest, problems", [("sha256", []), ("sha1", ["it is signed with sha1, which is broken"])])
def test_a_certificate_from_another_signer_is_checked_the_same_way(tmp_path, test_ca, node_key, digest, problems) -> None:
    """openssl as the signer: what it makes from the same CA and request is held to the same policy."""
    ca_cert, ca_key = test_ca
    (tmp_path / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca-key.pem").write_bytes(ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()))
    csr = x509.CertificateSigningRequestBuilder().subject_name(NODE_NAME).sign(node_key, hashes.SHA256())
    (tmp_path / "node.csr").write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ext.cnf").write_text("basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
                                      "extendedKeyUsage = clientAuth\n")
    _openssl("x509", "-req", "-in", str(tmp_path / "node.csr"), "-CA", str(tmp_path / "ca.pem"), "-CAkey",
             str(tmp_path / "ca-key.pem"), "-CAcreateserial", "-days", "30", f"-{digest}", "-extfile",
             str(tmp_path / "ext.cnf"), "-out", str(tmp_path / "node.pem"))
    cert = x509.load_pem_x509_certificate((tmp_path / "node.pem").read_bytes())
    checked_at = dt.datetime.now(dt.UTC)  # after the signer returned, as a caller checks what it got
    assert pki.check_node_certificate(cert, ca_cert, NODE, node_key.public_key(), checked_at, dt.timedelta(days=30)) == problems


ED25519_OID = bytes.fromhex("06032b6570")  # OBJECT IDENTIFIER 1.3.101.112 (Ed25519), DER
UNKNOWN_OID = bytes.fromhex("06032b6563")  # OBJECT IDENTIFIER 1.3.101.99: no key type cryptography knows


def _unknown_key_type(der: bytes) -> bytes:
    """``der`` with its first Ed25519 algorithm identifier (a certificate's or request's key) made an unknown one."""
    assert ED25519_OID in der
    return der.replace(ED25519_OID, UNKNOWN_OID, 1)


def test_a_v1_certificate_is_named_as_one(tmp_path: Path, test_ca: Any) -> None:
    """openssl's `x509 -req` with no extensions writes an X.509 v1 certificate: the version is named, and each
    extension a v1 certificate cannot have."""
    ca_cert, ca_key = test_ca
    (tmp_path / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca-key.pem").write_bytes(ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()))
    node_key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(NODE_NAME).sign(node_key, hashes.SHA256())
    (tmp_path / "node.csr").write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    subprocess.run(["openssl", "x509", "-req", "-in", str(tmp_path / "node.csr"), "-CA", str(tmp_path / "ca.pem"),
                    "-CAkey", str(tmp_path / "ca-key.pem"), "-CAcreateserial", "-days", "1",
                    "-out", str(tmp_path / "node.pem")], check=True, capture_output=True)
    cert = x509.load_pem_x509_certificate((tmp_path / "node.pem").read_bytes())
    assert cert.version == x509.Version.v1  # the positive control: openssl really wrote v1
    problems = policy.check_node_certificate(cert, ca_cert, NODE, node_key.public_key(), dt.datetime.now(dt.UTC))
    assert problems == ["it is an X.509 v1 certificate, not v3",
                        "it has no BasicConstraints extension (CA:FALSE)",
                        "it has no KeyUsage extension (digitalSignature)",
                        "it has no ExtendedKeyUsage extension (clientAuth)"]


def test_a_certificate_whose_key_cannot_be_read_says_so(test_ca: Any) -> None:
    ca_cert, _ = test_ca
    now = dt.datetime.now(dt.UTC)
    good = node_cert(test_ca, ed25519.Ed25519PrivateKey.generate())
    assert policy.check_node_certificate(good, ca_cert, NODE, None, now) == []  # the positive control
    cert = x509.load_der_x509_certificate(_unknown_key_type(good.public_bytes(serialization.Encoding.DER)))
    assert policy.check_node_certificate(cert, ca_cert, NODE, None, now) == [
        "it is not signed by the cluster CA (CN=llmgw test CA)",  # its bytes changed after signing
        "its public key cannot be read"]


# --------------------------------------------------------------------------- the keys signed for

def _csr(key: Any) -> str:
    sign_hash = None if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)) else hashes.SHA256()
    return x509.CertificateSigningRequestBuilder().subject_name(NODE_NAME).sign(key, sign_hash).public_bytes(
        serialization.Encoding.PEM).decode()


STRONG = {
    "P-256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "P-384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "P-521": lambda: ec.generate_private_key(ec.SECP521R1()),
    "Ed25519": ed25519.Ed25519PrivateKey.generate,
    "RSA 2048": lambda: rsa.generate_private_key(65537, 2048),
}
WEAK = {
    "secp256k1": (lambda: ec.generate_private_key(ec.SECP256K1()),
                  "an EC key on curve secp256k1, which is not one of P-256, P-384, P-521"),
    "brainpoolP256r1": (lambda: ec.generate_private_key(ec.BrainpoolP256R1()),
                        "an EC key on curve brainpoolP256r1, which is not one of P-256, P-384, P-521"),
    "P-224": (lambda: ec.generate_private_key(ec.SECP224R1()),
              "an EC key on curve secp224r1, which is not one of P-256, P-384, P-521"),
    "RSA 2047": (lambda: rsa.generate_private_key(65537, 2047), "an RSA key of 2047 bits, fewer than 2048"),
    "RSA 1024": (lambda: rsa.generate_private_key(65537, 1024), "an RSA key of 1024 bits, fewer than 2048"),
    "DSA": (lambda: dsa.generate_private_key(2048), "a DSA key, which is not one of P-256, P-384, P-521, Ed25519 or RSA"),
    "Ed448": (ed448.Ed448PrivateKey.generate, "a Ed448 key, which is not one of P-256, P-384, P-521, Ed25519 or RSA"),
}
if hasattr(ec, "SECT283K1"):
    # A binary curve, while cryptography still has them (46 is the last that does; 47 dropped them).
    WEAK["sect283k1"] = (lambda: ec.generate_private_key(ec.SECT283K1()),
                         "an EC key on curve sect283k1, which is not one of P-256, P-384, P-521")
KEY_FIX = ("give the node a P-256, P-384 or P-521 (ECDSA), Ed25519, or RSA key of at least 2048 bits: "
           "`pulumi up --replace` on its ClientCertificate has node-key.sh make a P-256 pair")


# Made once, at import: RSA and DSA keys take a while, and a mutation run forks every test run from this process.
STRONG_KEYS = {kind: make() for kind, make in STRONG.items()}
WEAK_KEYS = {kind: (make(), what) for kind, (make, what) in WEAK.items()}


@pytest.mark.parametrize("kind", STRONG)
def test_the_strong_keys_are_signed_for(ca, kind) -> None:
    key = STRONG_KEYS[kind]
    assert pki.requested_key(_csr(key), NODE) == key.public_key()
    auth = pki.load_authority(str(ca), NODE)
    issued = x509.load_pem_x509_certificate(pki.issue(auth, NODE, dt.timedelta(hours=1), NOW, key.public_key()).cert_pem.encode())
    assert issued.public_key() == key.public_key()


@pytest.mark.parametrize("kind", WEAK)
def test_any_other_key_is_refused_naming_the_node_the_key_and_the_fix(ca, kind) -> None:
    key, what = WEAK_KEYS[kind]
    with pytest.raises(CertificateRequestError) as err:
        pki.requested_key(_csr(key), NODE)
    assert str(err.value) == f"gpu-01: the node's key is {what}: it is not signed for\n  fix: {KEY_FIX}"
    # Nor is a certificate issued for it by any other way in (an operator's or another signer's request).
    with pytest.raises(CertificateRequestError) as err:
        pki.issue(pki.load_authority(str(ca), NODE), NODE, dt.timedelta(hours=1), NOW, key.public_key())
    assert str(err.value) == f"gpu-01: the key to certify is {what}: it is not signed for\n  fix: {KEY_FIX}"


def test_a_request_for_a_key_of_an_unknown_kind_is_refused_naming_the_node_and_the_fix() -> None:
    """A node's request whose key cryptography cannot read (a raw ValueError from cryptography before): refused
    with the package's error, its node and the key fix."""
    csr = x509.CertificateSigningRequestBuilder().subject_name(NODE_NAME).sign(ed25519.Ed25519PrivateKey.generate(), None)
    bad = x509.load_der_x509_csr(_unknown_key_type(csr.public_bytes(serialization.Encoding.DER)))
    with pytest.raises(CertificateRequestError) as err:
        policy.requested_key(bad.public_bytes(serialization.Encoding.PEM).decode(), NODE)
    assert str(err.value) == f"gpu-01: the node's key is of a kind this policy does not know\n  fix: {KEY_FIX}"


class _XrayPublicKey:
    """Stands for a key class of a private module (cryptography's were named ``_RSAPublicKey`` and the like)."""


class PublicKey:
    """A key class whose name says nothing of its kind."""


@pytest.mark.parametrize("key, kind", [(_XrayPublicKey(), "Xray"), (PublicKey(), "unknown"), (object(), "object")])
def test_a_key_of_no_kind_signed_for_is_named_by_its_class(key: object, kind: str) -> None:
    assert policy.key_problem(key) == f"a {kind} key, which is not one of P-256, P-384, P-521, Ed25519 or RSA"


# --------------------------------------------------------------------------- what issue() signs

def test_an_issued_certificate_meets_the_policy_by_an_independent_reading(ca) -> None:
    auth = pki.load_authority(str(ca), NODE)
    key = ec.generate_private_key(ec.SECP384R1())
    cert = x509.load_pem_x509_certificate(pki.issue(auth, NODE, dt.timedelta(hours=24), NOW, key.public_key()).cert_pem.encode())
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert (constraints.critical, constraints.value.ca) == (True, False)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value == x509.KeyUsage(**ONLY_DIGITAL_SIGNATURE)
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_before_utc <= NOW
    assert cert.not_valid_after_utc == (NOW + dt.timedelta(hours=24)).replace(microsecond=0)
    assert cert.issuer == auth.cert.subject and cert.public_key() == key.public_key()


def test_a_certificate_that_would_break_the_policy_is_not_handed_out(test_ca) -> None:
    # A CA that ended a minute ago (load_authority refuses it; here it is handed to issue() directly):
    # a certificate capped at its end would be expired on arrival.
    ca_cert, ca_key = test_ca
    ended = (x509.CertificateBuilder().subject_name(CA_NAME).issuer_name(CA_NAME).public_key(ca_key.public_key())
             .serial_number(1).not_valid_before(NOW - dt.timedelta(days=2)).not_valid_after(NOW - dt.timedelta(minutes=1))
             .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256()))
    with pytest.raises(CertificatePolicyError) as err:
        pki.issue(pki.Authority(ended, ca_key), NODE, dt.timedelta(hours=1), NOW)
    assert str(err.value).startswith("gpu-01: the certificate just signed breaks the node certificate policy: it expired on ")


# --------------------------------------------------------------------------- adoption

def _spki(key: Any) -> str:
    return base64.b64encode(key.public_key().public_bytes(serialization.Encoding.DER,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)).decode()


def test_what_the_onboarding_script_issues_is_adopted_as_its_canonical_bytes(ca, tmp_path) -> None:
    # onboard-node.sh runs `llmgw ctl cert issue-client`, which is lab/pki.py's issue_client_cert in the lab.
    cert_path, key_path = labpki.issue_client_cert(ca, tmp_path / "out", NODE)
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    text = cert_path.read_text()
    auth = pki.load_authority(str(ca), NODE)
    kept = pki.adoptable(auth, NODE, text, _spki(key), dt.timedelta(hours=24), NOW)
    assert kept is not None and kept.cert_pem == text  # the script's file is already one canonical block
    # With a second block and junk after it, what is recorded is the certificate alone, re-encoded.
    other = labpki.issue_client_cert(ca, tmp_path / "other", "gpu-02")[0].read_text()
    kept = pki.adoptable(auth, NODE, text + other + "trailing junk\n", _spki(key), dt.timedelta(hours=24), NOW)
    assert kept is not None and kept.cert_pem == text
    assert kept.fingerprint_sha256 == x509.load_pem_x509_certificate(text.encode()).fingerprint(hashes.SHA256()).hex()


@pytest.mark.parametrize("change, logged", [
    ({"purposes": [ExtendedKeyUsageOID.SERVER_AUTH]}, "its ExtendedKeyUsage is serverAuth, not clientAuth only"),
    ({"purposes": None}, "it has no ExtendedKeyUsage extension (clientAuth)"),
    ({"not_before": NOW + dt.timedelta(hours=1)}, "it is not valid before "),
    ({"constraints": (x509.BasicConstraints(ca=True, path_length=None), True)}, "its BasicConstraints say CA:TRUE"),
    ({"usage": (x509.KeyUsage(**{**ONLY_DIGITAL_SIGNATURE, "key_cert_sign": True}), True)},
     "its KeyUsage also allows key_cert_sign"),
    ({"key": lambda: rsa.generate_private_key(65537, 1024)}, "its key is an RSA key of 1024 bits, fewer than 2048"),
], ids=["serverAuth", "no clientAuth", "not yet valid", "CA:TRUE", "keyCertSign", "weak key"])
def test_a_certificate_that_breaks_the_policy_is_not_adopted(ca, caplog, change, logged) -> None:
    auth = pki.load_authority(str(ca), NODE)
    ca_key = serialization.load_pem_private_key((ca / "ca-key.pem").read_bytes(), None)
    strong = ec.generate_private_key(ec.SECP256R1())
    good = node_cert((auth.cert, ca_key), strong).public_bytes(serialization.Encoding.PEM).decode()
    assert pki.adoptable(auth, NODE, good, _spki(strong), dt.timedelta(hours=1), NOW) is not None  # the positive control
    change = dict(change)  # the parameter's own dict is shared by every run of the test
    key = change.pop("key", lambda: strong)()
    bad = node_cert((auth.cert, ca_key), key, **change).public_bytes(serialization.Encoding.PEM).decode()
    with caplog.at_level("WARNING", logger="llmgw_pulumi.certificates.pki"):
        assert pki.adoptable(auth, NODE, bad, _spki(key), dt.timedelta(hours=1), NOW) is None
    assert [r.getMessage() for r in caplog.records if logged in r.getMessage() and r.getMessage().startswith(
        "gpu-01: the certificate on the node is not kept (")], caplog.text


# --------------------------------------------------------------------------- the CA (L7)

def _write_ca(d: Path, cert: x509.Certificate, key: Any, encryption: Any = None, fmt: Any = None) -> None:
    d.mkdir(exist_ok=True)
    (d / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "ca-key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt or serialization.PrivateFormat.PKCS8,
                                                     encryption or serialization.NoEncryption()))
    (d / "ca-key.pem").chmod(0o600)


def _self_signed(key: Any, *extensions: tuple[x509.ExtensionType, bool]) -> x509.Certificate:
    builder = (x509.CertificateBuilder().subject_name(CA_NAME).issuer_name(CA_NAME).public_key(key.public_key())
               .serial_number(1).not_valid_before(NOW - dt.timedelta(hours=1)).not_valid_after(NOW + dt.timedelta(days=30)))
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(key, hashes.SHA256())


CA_FIX = ("point llmgw:pkiDir at the cluster CA that `llmgw ctl cert init-ca` made (its ca.pem is CA:TRUE); "
          "a node certificate cannot issue identities")


@pytest.mark.parametrize("extensions, problem", [
    ([(x509.BasicConstraints(ca=False, path_length=None), True)], "is not a CA certificate (its BasicConstraints say CA:FALSE)"),
    ([], "has no BasicConstraints extension, so it is not a CA certificate (CA:TRUE)"),
    ([(x509.BasicConstraints(ca=True, path_length=0), True), (x509.KeyUsage(**ONLY_DIGITAL_SIGNATURE), True)],
     "is a CA certificate whose KeyUsage does not allow signing certificates (keyCertSign)"),
], ids=["CA:FALSE", "no BasicConstraints", "no keyCertSign"])
def test_the_ca_certificate_must_be_a_ca(tmp_path, extensions, problem) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    _write_ca(tmp_path / "pki", _self_signed(key, *extensions), key)
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(tmp_path / "pki"), NODE)
    assert str(err.value) == f"gpu-01: {tmp_path / 'pki' / 'ca.pem'} {problem}\n  fix: {CA_FIX}"
    # The same pair as a CA loads: the refusal above is about CA:TRUE alone.
    _write_ca(tmp_path / "ok", _self_signed(key, (x509.BasicConstraints(ca=True, path_length=0), True)), key)
    assert pki.load_authority(str(tmp_path / "ok"), NODE).cert.subject == CA_NAME


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o660, 0o644])
def test_a_ca_key_open_to_group_or_others_is_refused_with_the_chmod(ca, mode) -> None:
    key_path = ca / "ca-key.pem"
    key_path.chmod(mode)
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE)
    assert str(err.value) == (f"gpu-01: {key_path} is open to group or others (mode {mode:04o}): the CA key must be "
                              f"readable by its owner only\n  fix: chmod 600 {key_path}")
    key_path.chmod(0o600)
    assert pki.load_authority(str(ca), NODE).cert is not None
    key_path.chmod(0o400)
    assert pki.load_authority(str(ca), NODE).cert is not None


PASSPHRASE = "correct horse battery staple"


@pytest.mark.parametrize("fmt", [serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.TraditionalOpenSSL],
                         ids=["PKCS#8", "traditional"])
def test_an_encrypted_ca_key_works_with_its_passphrase(tmp_path, fmt) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _self_signed(key, (x509.BasicConstraints(ca=True, path_length=0), True))
    _write_ca(tmp_path, cert, key, serialization.BestAvailableEncryption(PASSPHRASE.encode()), fmt)
    assert b"ENCRYPTED" in (tmp_path / "ca-key.pem").read_bytes()
    auth = pki.load_authority(str(tmp_path), NODE, passphrase=PASSPHRASE)
    issued = x509.load_pem_x509_certificate(pki.issue(auth, NODE, dt.timedelta(hours=1), NOW).cert_pem.encode())
    issued.verify_directly_issued_by(cert)
    key_path = tmp_path / "ca-key.pem"
    cases = {
        None: (f"{key_path} is encrypted, and no passphrase for it is configured",
               "set it as a secret: `pulumi config set --secret llmgw:caKeyPassphrase` "
               "(NodeArgs.ca_key_passphrase, in a program of your own)"),
        "wrong horse": (f"{key_path} cannot be decrypted with the configured passphrase",
                        "fix the llmgw:caKeyPassphrase secret"),
    }
    for given, (problem, fix) in cases.items():
        with pytest.raises(AuthorityError) as err:
            pki.load_authority(str(tmp_path), NODE, passphrase=given)
        assert str(err.value) == f"gpu-01: {problem}\n  fix: {fix}"
        # Nothing of cryptography's own error (which might quote the key) is chained to what the operator sees.
        assert "horse" not in str(err.value) and err.value.__cause__ is None
        assert err.value.__context__ is None or err.value.__suppress_context__


def test_a_passphrase_for_a_key_that_is_not_encrypted_is_refused(ca) -> None:
    key_path = ca / "ca-key.pem"
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE, passphrase=PASSPHRASE)
    assert str(err.value) == (
        f"gpu-01: {key_path} is not encrypted, yet llmgw:caKeyPassphrase is set\n  fix: remove the secret "
        f"(`pulumi config rm llmgw:caKeyPassphrase`), or encrypt the key: `openssl pkey -in {key_path} -aes256 "
        "-out ca-key.enc.pem`, then move it over ca-key.pem")
    assert "horse" not in str(err.value)


def test_what_issue_records_for_a_requested_key(ca) -> None:
    auth = pki.load_authority(str(ca), NODE)
    key = ec.generate_private_key(ec.SECP256R1())
    issued = pki.issue(auth, NODE, dt.timedelta(hours=24), NOW, key.public_key())
    cert = x509.load_pem_x509_certificate(issued.cert_pem.encode())
    assert issued.key_pem == "", "a key pair was made here for a key the node holds"
    assert issued.serial == format(cert.serial_number, "x") and issued.serial == issued.serial.lower()
    assert issued.not_after == cert.not_valid_after_utc.isoformat()
    assert cert.not_valid_before_utc == (NOW - dt.timedelta(minutes=5)).replace(microsecond=0)
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).critical is False
    assert issued.fingerprint_sha256 == cert.fingerprint(hashes.SHA256()).hex()


def test_an_ed25519_ca_signs_without_a_digest(tmp_path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    builder = (x509.CertificateBuilder().subject_name(CA_NAME).issuer_name(CA_NAME).public_key(key.public_key())
               .serial_number(1).not_valid_before(NOW - dt.timedelta(hours=1)).not_valid_after(NOW + dt.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True))
    _write_ca(tmp_path, builder.sign(key, None), key)
    auth = pki.load_authority(str(tmp_path), NODE)
    cert = x509.load_pem_x509_certificate(pki.issue(auth, NODE, dt.timedelta(hours=1), NOW).cert_pem.encode())
    cert.verify_directly_issued_by(auth.cert)
    assert cert.signature_hash_algorithm is None


def test_an_adopted_record_holds_no_key(ca, tmp_path) -> None:
    cert_path, key_path = labpki.issue_client_cert(ca, tmp_path / "out", NODE)
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    kept = pki.adoptable(pki.load_authority(str(ca), NODE), NODE, cert_path.read_text(), _spki(key), dt.timedelta(hours=1), NOW)
    assert kept is not None and kept.key_pem == ""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    assert kept.serial == format(cert.serial_number, "x") and kept.not_after == cert.not_valid_after_utc.isoformat()


@pytest.mark.parametrize("missing", [["ca.pem"], ["ca-key.pem"], ["ca.pem", "ca-key.pem"]])
def test_a_missing_half_of_the_ca_is_named(ca, missing) -> None:
    for name in missing:
        (ca / name).unlink()
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE)
    assert str(err.value).startswith(f"gpu-01: no authority in {ca} ({', '.join(missing)} missing); create one first\n")


def test_a_ca_key_this_user_cannot_read_and_a_ca_certificate_that_is_not_pem(ca, monkeypatch) -> None:
    (ca / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE)
    assert str(err.value).startswith(f"gpu-01: {ca / 'ca.pem'} is not a PEM certificate\n  fix: ")
    # As root every file is readable: the refusal of os.access is what another user meets.
    monkeypatch.setattr(pki.os, "access", lambda path, mode: False)
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE)
    assert str(err.value) == (f"gpu-01: cannot read {ca / 'ca-key.pem'}\n  fix: run Pulumi as a user that may read the "
                              "CA key (only the CA host can issue identities)")


# --------------------------------------------------------------------------- boundaries (the mutation run's survivors)

NOW0 = NOW.replace(microsecond=0)
"""Now, to the second: a certificate's times have no fractions, so a bound can be met exactly."""


def test_each_validity_bound_is_inclusive_where_it_should_be(test_ca, node_key) -> None:
    ca, asked = test_ca[0], dt.timedelta(hours=24)
    check = pki.check_node_certificate
    starts_at_the_bound = node_cert(test_ca, node_key, not_before=NOW0 + pki.CLOCK_SKEW)
    assert check(starts_at_the_bound, ca, NODE, None, NOW0) == []
    ends_now = node_cert(test_ca, node_key, not_before=NOW0 - dt.timedelta(days=1), not_after=NOW0)
    assert check(ends_now, ca, NODE, None, NOW0) == [f"it expired on {when(NOW0)} UTC"]
    ends_at_the_bound = node_cert(test_ca, node_key, not_after=NOW0 + asked + pki.CLOCK_SKEW)
    assert check(ends_at_the_bound, ca, NODE, None, NOW0, asked) == []


@pytest.mark.parametrize("purposes, problem", [
    ([x509.ObjectIdentifier("1.3.6.1.4.1.55555.2")], "its ExtendedKeyUsage is 1.3.6.1.4.1.55555.2, not clientAuth only"),
    # An empty ExtendedKeyUsage is malformed (RFC 5280: at least one purpose): the extensions do not parse.
    ([], "its extensions cannot be parsed (one is given twice, or malformed)"),
], ids=["unknown purpose", "no purpose"])
def test_an_extended_key_usage_without_a_name_is_shown_by_its_oid(test_ca, node_key, purposes, problem) -> None:
    cert = node_cert(test_ca, node_key, purposes=purposes)
    assert pki.check_node_certificate(cert, test_ca[0], NODE, None, NOW) == [problem]


def test_adoption_needs_the_certificate_the_nodes_key_and_time_before_renewal(ca, tmp_path) -> None:
    auth = pki.load_authority(str(ca), NODE)
    ca_key = serialization.load_pem_private_key((ca / "ca-key.pem").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = node_cert((auth.cert, ca_key), key, not_after=NOW0 + dt.timedelta(hours=10)).public_bytes(
        serialization.Encoding.PEM).decode()
    hours = dt.timedelta(hours=1)
    assert pki.adoptable(auth, NODE, pem, _spki(key), hours, NOW0) is not None  # the positive control
    assert pki.adoptable(auth, NODE, None, _spki(key), hours, NOW0) is None
    assert pki.adoptable(auth, NODE, pem, "", hours, NOW0) is None
    assert pki.adoptable(auth, NODE, pem, _spki(ec.generate_private_key(ec.SECP256R1())), hours, NOW0) is None
    # Ten hours left: kept with a renewal window of 9 h 59 min, not with one of exactly 10 h.
    assert pki.adoptable(auth, NODE, pem, _spki(key), dt.timedelta(hours=10) - dt.timedelta(minutes=1), NOW0) is not None
    assert pki.adoptable(auth, NODE, pem, _spki(key), dt.timedelta(hours=10), NOW0) is None


def test_the_ca_errors_name_the_node(ca) -> None:
    auth = pki.load_authority(str(ca), NODE)
    end = auth.cert.not_valid_after_utc
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE, now=end)
    assert str(err.value) == (f"gpu-01: the CA in {ca} expired on {end:%Y-%m-%d}\n  fix: rotate the cluster CA "
                              "('llmgw ctl cert init-ca' in a new dir) and re-onboard the nodes")
    start = auth.cert.not_valid_before_utc
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE, now=start - dt.timedelta(seconds=1))
    assert str(err.value) == f"gpu-01: the CA in {ca} is not valid before {start:%Y-%m-%d %H:%M}\n  fix: check this machine's clock"
    assert pki.load_authority(str(ca), NODE, now=start).cert == auth.cert
    (ca / "ca-key.pem").write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE)
    assert str(err.value) == (f"gpu-01: ca-key.pem does not belong to ca.pem in {ca}\n  fix: restore the matching pair "
                              "from backup; a CA key that does not match its certificate cannot issue identities")
    (ca / "ca-key.pem").write_text("not a key\n")
    with pytest.raises(AuthorityError) as err:
        pki.load_authority(str(ca), NODE)
    assert str(err.value).startswith(f"gpu-01: {ca / 'ca-key.pem'} is not a PEM private key\n  fix: ")


def test_a_request_that_is_not_one_or_not_signed_by_its_key(test_ca) -> None:
    with pytest.raises(CertificateRequestError) as err:
        pki.requested_key("not a request\n", NODE)
    assert_refused(err.value, CertificateRequestError, NODE)
    assert err.value.message == "the node returned something that is not a PEM certificate signing request"
    der = bytearray(x509.load_pem_x509_csr(_csr(ec.generate_private_key(ec.SECP256R1())).encode()).public_bytes(
        serialization.Encoding.DER))
    der[-5] ^= 0xFF  # a flipped bit in the signature
    forged = "-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der)).decode() + "-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(CertificateRequestError) as err:
        pki.requested_key(forged, NODE)
    assert err.value.node == NODE and "it is not signed by its own key" in err.value.message and err.value.fix


def test_spki_and_verify_issued_read_the_certificate(test_ca, node_key) -> None:
    pem = node_cert(test_ca, node_key).public_bytes(serialization.Encoding.PEM).decode()
    assert pki.spki_b64(pem) == _spki(node_key)
    ca_pem = test_ca[0].public_bytes(serialization.Encoding.PEM).decode()
    assert pki.verify_issued(ca_pem, pem) is True
    other = node_cert((test_ca[0], ec.generate_private_key(ec.SECP256R1())), node_key).public_bytes(serialization.Encoding.PEM)
    assert pki.verify_issued(ca_pem, other.decode()) is False


def test_several_problems_are_all_named_in_order(ca, test_ca, node_key, caplog) -> None:
    unknown = [(x509.UnrecognizedExtension(x509.ObjectIdentifier(f"1.3.6.1.4.1.55555.{n}"), b"\x05\x00"), True) for n in (7, 8)]
    cert = node_cert(test_ca, node_key, extra=unknown)
    assert pki.check_node_certificate(cert, test_ca[0], NODE, None, NOW) == [
        "it has critical extensions this policy does not know: 1.3.6.1.4.1.55555.7, 1.3.6.1.4.1.55555.8",
        "it has extensions a node certificate must not have: 1.3.6.1.4.1.55555.7, 1.3.6.1.4.1.55555.8"]
    auth = pki.load_authority(str(ca), NODE)
    ca_key = serialization.load_pem_private_key((ca / "ca-key.pem").read_bytes(), None)
    bad = node_cert((auth.cert, ca_key), node_key, constraints=(x509.BasicConstraints(ca=True, path_length=None), True),
                    purposes=[ExtendedKeyUsageOID.SERVER_AUTH]).public_bytes(serialization.Encoding.PEM).decode()
    with caplog.at_level("WARNING", logger="llmgw_pulumi.certificates.pki"):
        assert pki.adoptable(auth, NODE, bad, _spki(node_key), dt.timedelta(hours=1), NOW) is None
    assert [r.getMessage() for r in caplog.records] == [
        "gpu-01: the certificate on the node is not kept (its BasicConstraints say CA:TRUE: it could sign certificates; "
        "its ExtendedKeyUsage is serverAuth, not clientAuth only); a new key pair is made there and signed"]


# --------------------------------------------------------------------------- signer caKey and the signers' requests
#
# llmgw:signer.ca (a CA certificate given as text) and the llmgw:caKey secret, and what a signer is asked for.

def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: Any) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def test_the_signer_ca_must_be_a_pem_ca_certificate_valid_now(test_ca) -> None:
    ca_cert, ca_key = test_ca
    assert pki.ca_certificate(_pem(ca_cert), NODE, NOW) == ca_cert
    with pytest.raises(AuthorityError) as err:
        pki.ca_certificate("not a certificate\n", NODE, NOW)
    assert str(err.value) == ("gpu-01: llmgw:signer.ca is not a PEM certificate\n"
                              "  fix: give the CA certificate (ca.pem) as a path or as its PEM text")
    leaf = _self_signed(ca_key, (x509.BasicConstraints(ca=False, path_length=None), True))
    with pytest.raises(AuthorityError) as err:
        pki.ca_certificate(_pem(leaf), NODE, NOW)
    assert str(err.value) == ("gpu-01: llmgw:signer.ca is not a CA certificate (its BasicConstraints say CA:FALSE)\n"
                              "  fix: give the cluster CA's certificate (CA:TRUE)")
    end = ca_cert.not_valid_after_utc
    with pytest.raises(AuthorityError) as err:
        pki.ca_certificate(_pem(ca_cert), NODE, end)
    assert str(err.value).startswith(f"gpu-01: the CA in llmgw:signer.ca expired on {end:%Y-%m-%d}\n  fix: ")
    start = ca_cert.not_valid_before_utc
    with pytest.raises(AuthorityError, match="gpu-01: the CA in llmgw:signer.ca is not valid before"):
        pki.ca_certificate(_pem(ca_cert), NODE, start - dt.timedelta(seconds=1))
    assert pki.ca_certificate(_pem(ca_cert), NODE, start) == ca_cert


def test_the_ca_key_secret_must_be_the_signer_cas_key_and_is_never_quoted(test_ca) -> None:
    ca_cert, ca_key = test_ca
    auth = pki.authority_from_pem(_pem(ca_cert), _key_pem(ca_key), NODE, NOW)
    assert auth.cert == ca_cert and auth.key.public_key() == ca_key.public_key()  # type: ignore[attr-defined]
    issued = pki.issue(auth, NODE, dt.timedelta(hours=1), NOW)
    assert pki.verify_issued(_pem(ca_cert), issued.cert_pem)
    with pytest.raises(AuthorityError) as err:
        pki.authority_from_pem(_pem(ca_cert), fake_pem("PRIVATE KEY", "TOPSECRETBYTES"), NODE, NOW)
    assert str(err.value) == ("gpu-01: the llmgw:caKey secret is not an unencrypted PEM private key\n"
                              "  fix: set it again: `pulumi config set --secret llmgw:caKey < ca-key.pem`")
    encrypted = ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.BestAvailableEncryption(b"pass")).decode()
    with pytest.raises(AuthorityError, match="is not an unencrypted PEM private key"):
        pki.authority_from_pem(_pem(ca_cert), encrypted, NODE, NOW)
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(AuthorityError) as err:
        pki.authority_from_pem(_pem(ca_cert), _key_pem(other), NODE, NOW)
    assert str(err.value) == ("gpu-01: the CA key does not belong to the CA certificate of llmgw:signer.ca and "
                              "llmgw:caKey\n  fix: give the key and the certificate of the same CA")
    assert _key_pem(other) not in str(err.value)
    with pytest.raises(AuthorityError, match="expired"):
        pki.authority_from_pem(_pem(ca_cert), _key_pem(ca_key), NODE, ca_cert.not_valid_after_utc)


def test_a_key_here_signs_exactly_the_validity_a_signer_request_asks_for(test_ca, node_key) -> None:
    from llmgw_pulumi.certificates import signer

    ca_cert, ca_key = test_ca
    auth = pki.Authority(cert=ca_cert, key=ca_key)
    req = signer.request(NODE, _csr(node_key), dt.timedelta(hours=30), NOW, ca_cert.not_valid_after_utc)
    cert = x509.load_pem_x509_certificate(pki.issue_for_request(auth, req).encode())
    assert cert.not_valid_before_utc == req.not_before
    assert cert.not_valid_after_utc == req.not_after
    assert cert.public_key() == node_key.public_key()
    assert pki.check_node_certificate(cert, ca_cert, NODE, node_key.public_key(), NOW) == []
    weak = signer.request(NODE, _csr(ec.generate_private_key(ec.SECP192R1())), dt.timedelta(hours=1), NOW,
                          ca_cert.not_valid_after_utc)
    with pytest.raises(CertificateRequestError, match="gpu-01: the node's key is an EC key on curve secp192r1"):
        pki.issue_for_request(auth, weak)


def test_an_operator_key_pair_comes_with_its_own_request_for_the_node(test_ca) -> None:
    key_pem, csr_pem = pki.operator_key_and_csr(NODE)
    key = serialization.load_pem_private_key(key_pem.encode(), None)
    csr = x509.load_pem_x509_csr(csr_pem.encode())
    assert csr.is_signature_valid and csr.public_key() == key.public_key()
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert [a.value for a in csr.subject] == [NODE]
    assert pki.requested_key(csr_pem, NODE) == key.public_key()
    assert pki.operator_key_and_csr(NODE)[0] != key_pem


def _request(test_ca, key: Any, hours: int = 30) -> tuple[Any, dt.datetime]:
    """A signer request for ``key`` made at a whole second (so its validity is whole hours), and that second."""
    from llmgw_pulumi.certificates import signer

    now = NOW.replace(microsecond=0)
    return signer.request(NODE, _csr(key), dt.timedelta(hours=hours), now, test_ca[0].not_valid_after_utc), now


def test_what_a_signer_returns_is_held_to_the_request(test_ca, node_key) -> None:
    from llmgw_pulumi.certificates import signer

    req, now = _request(test_ca, node_key)
    assert pki.signed_problems(test_ca[0], node_cert(test_ca, node_key, not_before=req.not_before,
                                                     not_after=req.not_after), req, now) == []
    other = node_cert(test_ca, ec.generate_private_key(ec.SECP256R1()), not_before=req.not_before, not_after=req.not_after)
    assert pki.signed_problems(test_ca[0], other, req, now) == ["its key is not the key it was asked for"]
    late = req.not_after + pki.CLOCK_SKEW
    assert pki.signed_problems(test_ca[0], node_cert(test_ca, node_key, not_before=req.not_before, not_after=late),
                               req, now) == []
    longer = node_cert(test_ca, node_key, not_before=req.not_before, not_after=late + dt.timedelta(seconds=1))
    assert pki.signed_problems(test_ca[0], longer, req, now) == [
        f"it is valid until {when(late + dt.timedelta(seconds=1))} UTC, longer than the 30 h asked"]
    early = req.not_before - pki.CLOCK_SKEW
    assert pki.signed_problems(test_ca[0], node_cert(test_ca, node_key, not_before=early, not_after=req.not_after),
                               req, now) == []
    earlier = node_cert(test_ca, node_key, not_before=early - dt.timedelta(seconds=1), not_after=req.not_after)
    assert pki.signed_problems(test_ca[0], earlier, req, now) == [
        f"it starts {early - dt.timedelta(seconds=1):%Y-%m-%d %H:%M}, before the start asked ({req.not_before:%Y-%m-%d %H:%M})"]
    unreadable = signer.SigningRequest(NODE, "not a request\n", req.not_before, req.not_after)
    assert pki.signed_problems(test_ca[0], node_cert(test_ca, node_key, not_before=req.not_before,
                                                     not_after=req.not_after), unreadable, now) == [
        "the request's public key cannot be read"]


def test_the_first_certificate_a_signer_prints_is_taken_and_checked(test_ca, node_key) -> None:
    req, now = _request(test_ca, node_key)
    leaf = _pem(node_cert(test_ca, node_key, not_before=req.not_before, not_after=req.not_after))
    chain = _pem(test_ca[0])
    for printed in (leaf, f"signing {NODE}...\n{leaf}{chain}", f"-----END CERTIFICATE-----\n{leaf}",
                    leaf.replace("\n", "\r\n") + chain):
        got = pki.accept_signed(test_ca[0], printed, req, now)
        assert got.cert_pem == leaf and got.key_pem == ""
    for printed in ("", "signed.\n", leaf.split("-----END")[0], leaf.split("\n", 1)[1]):
        with pytest.raises(SignedCertificateError) as err:
            pki.accept_signed(test_ca[0], printed, req, now)
        assert_refused(err.value, SignedCertificateError, NODE)
        assert err.value.message == "the signer printed no readable PEM certificate"
    other = ec.generate_private_key(ec.SECP256R1())
    bad = _pem(node_cert(test_ca, other, not_before=req.not_before, not_after=req.not_after + dt.timedelta(days=1)))
    with pytest.raises(SignedCertificateError) as err:
        pki.accept_signed(test_ca[0], bad, req, now)
    assert_refused(err.value, SignedCertificateError, NODE)
    assert err.value.message == (
        "the signer returned a certificate that is refused: its key is not the key it was asked for; "
        f"it is valid until {when(req.not_after + dt.timedelta(days=1))} UTC, longer than the 30 h asked")
