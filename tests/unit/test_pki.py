"""Certificate issuance from the cluster CA: CN = node id, clientAuth, capped validity, clear CA errors."""

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab import pki as labpki
from llmgw_pulumi import pki
from llmgw_pulumi.errors import AuthorityError
from tests.unit import fake_pem

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
