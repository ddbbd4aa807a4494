"""Edges of the node certificate policy and of host-key fingerprints that the mutation run showed no test asked.

Every certificate, request and key below is made here (with cryptography, the openssl CLI, or by changing one
object identifier in a DER encoding); the expected words are written out, and fingerprints are ssh-keygen's.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw_pulumi import cert_policy, ssh_keys
from llmgw_pulumi.errors import CertificateRequestError

NODE = "gpu-01"
NODE_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)])
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "policy edge CA")])
ED25519_OID = bytes.fromhex("06032b6570")  # OBJECT IDENTIFIER 1.3.101.112 (Ed25519), DER
UNKNOWN_OID = bytes.fromhex("06032b6563")  # OBJECT IDENTIFIER 1.3.101.99: no key type cryptography knows
KEY_FIX = ("give the node a P-256, P-384 or P-521 (ECDSA), Ed25519, or RSA key of at least 2048 bits: "
           "`pulumi up --replace` on its ClientCertificate has node-key.sh make a P-256 pair")


@pytest.fixture(scope="module")
def ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
    cert = (x509.CertificateBuilder().subject_name(CA_NAME).issuer_name(CA_NAME).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _unknown_key_type(der: bytes) -> bytes:
    """``der`` with its first Ed25519 algorithm identifier (a certificate's or request's key) made an unknown one."""
    assert ED25519_OID in der
    return der.replace(ED25519_OID, UNKNOWN_OID, 1)


def test_a_v1_certificate_is_named_as_one(tmp_path: Path, ca: Any) -> None:
    """openssl's `x509 -req` with no extensions writes an X.509 v1 certificate: the version is named, and each
    extension a v1 certificate cannot have."""
    ca_cert, ca_key = ca
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
    problems = cert_policy.check_node_certificate(cert, ca_cert, NODE, node_key.public_key(), dt.datetime.now(dt.UTC))
    assert problems == ["it is an X.509 v1 certificate, not v3",
                        "it has no BasicConstraints extension (CA:FALSE)",
                        "it has no KeyUsage extension (digitalSignature)",
                        "it has no ExtendedKeyUsage extension (clientAuth)"]


def test_a_certificate_whose_key_cannot_be_read_says_so(ca: Any) -> None:
    ca_cert, ca_key = ca
    now = dt.datetime.now(dt.UTC)
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False)
    good = (x509.CertificateBuilder().subject_name(NODE_NAME).issuer_name(CA_NAME)
            .public_key(ed25519.Ed25519PrivateKey.generate().public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    assert cert_policy.check_node_certificate(good, ca_cert, NODE, None, now) == []  # the positive control
    cert = x509.load_der_x509_certificate(_unknown_key_type(good.public_bytes(serialization.Encoding.DER)))
    assert cert_policy.check_node_certificate(cert, ca_cert, NODE, None, now) == [
        "it is not signed by the cluster CA (CN=policy edge CA)",  # its bytes changed after signing
        "its public key cannot be read"]


def test_a_request_for_a_key_of_an_unknown_kind_is_refused_naming_the_node_and_the_fix() -> None:
    """A node's request whose key cryptography cannot read (a raw ValueError from cryptography before): refused
    with the package's error, its node and the key fix."""
    csr = x509.CertificateSigningRequestBuilder().subject_name(NODE_NAME).sign(ed25519.Ed25519PrivateKey.generate(), None)
    bad = x509.load_der_x509_csr(_unknown_key_type(csr.public_bytes(serialization.Encoding.DER)))
    with pytest.raises(CertificateRequestError) as err:
        cert_policy.requested_key(bad.public_bytes(serialization.Encoding.PEM).decode(), NODE)
    assert str(err.value) == f"gpu-01: the node's key is of a kind this policy does not know\n  fix: {KEY_FIX}"


class _XrayPublicKey:
    """Stands for a key class of a private module (cryptography's were named ``_RSAPublicKey`` and the like)."""


class PublicKey:
    """A key class whose name says nothing of its kind."""


@pytest.mark.parametrize("key, kind", [(_XrayPublicKey(), "Xray"), (PublicKey(), "unknown"), (object(), "object")])
def test_a_key_of_no_kind_signed_for_is_named_by_its_class(key: object, kind: str) -> None:
    assert cert_policy.key_problem(key) == f"a {kind} key, which is not one of P-256, P-384, P-521, Ed25519 or RSA"


def _openssh(key: Any) -> str:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


@pytest.mark.parametrize("make", [ed25519.Ed25519PrivateKey.generate, lambda: ec.generate_private_key(ec.SECP384R1()),
                                  lambda: rsa.generate_private_key(65537, 2048)], ids=["ed25519", "ecdsa", "rsa"])
def test_a_fingerprint_is_the_one_ssh_keygen_prints_with_or_without_the_comment(make: Any) -> None:
    line = _openssh(make())
    printed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", "-"], input=f"{line} root@gpu-01\n",
                             capture_output=True, text=True, check=True).stdout.split()[1]
    assert printed.startswith("SHA256:")
    assert ssh_keys.fingerprint(line) == printed
    assert ssh_keys.fingerprint(f"{line} root@gpu-01 (a .pub line)") == printed
