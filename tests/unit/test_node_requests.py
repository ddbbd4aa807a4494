"""The node certificate policy is exact: a node's request for anything but CN=<node id> is refused before any
signer sees it, and a certificate with more than the policy allows (a SAN, another extension, O=) is refused
whoever signed it.

The requests are made here with cryptography (or the openssl CLI); the ClientCertificate provider is driven as
the engine drives it, on a fake node (tests/fakenode.py) whose key-making step answers with the hostile request.
The signers count their calls: the pkiDir signer through ``signing.KeySigner.sign``, the command signer as a real
program that appends a line to a file and then signs what it is given, verbatim, with openssl (as a
`sign-verbatim` CA would).
"""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import AttributeOID, NameOID

from llmgw_pulumi.certificates import pki, policy, signer, signing
from llmgw_pulumi.errors import CertificateRequestError
from llmgw_pulumi.nodestate.commands import Result, Script
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.ssh import sessions
from tests.fakenode import FakeNode, FakeNodes

NODE = "gpu-01"
ADDR = "10.0.0.11"
CONN = {"host": ADDR, "user": "deploy", "port": 22.0, "wait": 5.0}
NODE_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)])
P256 = ec.generate_private_key(ec.SECP256R1())
RSA_1024 = rsa.generate_private_key(65537, 1024)
RSA_2048 = rsa.generate_private_key(65537, 2048)


def pem(csr: x509.CertificateSigningRequest) -> str:
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def request(name: x509.Name = NODE_NAME, key: Any = P256,
            extensions: tuple[tuple[x509.ExtensionType, bool], ...] = ()) -> str:
    builder = x509.CertificateSigningRequestBuilder().subject_name(name)
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return pem(builder.sign(key, hashes.SHA256()))


def flipped_signature(csr_pem: str) -> str:
    der = bytearray(x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0xFF  # a bit of the signature
    return ("-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der)).decode()
            + "-----END CERTIFICATE REQUEST-----\n")


def md5_request(tmp: Path) -> str:
    """A request for CN=gpu-01 alone, signed with MD5 (openssl req -md5), by a strong RSA key."""
    key = tmp / "rsa.pem"
    key.write_bytes(RSA_2048.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    done = subprocess.run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={NODE}", "-md5"],
                          capture_output=True, text=True, check=True)
    csr = x509.load_pem_x509_csr(done.stdout.encode())
    assert isinstance(csr.signature_hash_algorithm, hashes.MD5)  # the positive control: openssl really used MD5
    return done.stdout


HOSTILE: dict[str, Callable[[Path], str]] = {
    "another CN": lambda _: request(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-02")])),
    "O= too": lambda _: request(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ops"),
                                           x509.NameAttribute(NameOID.COMMON_NAME, NODE)])),
    "two CNs": lambda _: request(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE),
                                            x509.NameAttribute(NameOID.COMMON_NAME, "gpu-02")])),
    "a SAN": lambda _: request(extensions=((x509.SubjectAlternativeName([x509.DNSName("gpu-02")]), False),)),
    "an extension request": lambda _: request(
        extensions=((x509.BasicConstraints(ca=True, path_length=None), True),)),
    "another attribute": lambda _: pem(x509.CertificateSigningRequestBuilder().subject_name(NODE_NAME)
                                       .add_attribute(AttributeOID.CHALLENGE_PASSWORD, b"let me in")
                                       .sign(P256, hashes.SHA256())),
    "a weak key": lambda _: request(key=RSA_1024),
    "a bad signature": lambda _: flipped_signature(request()),
    "an MD5 signature": md5_request,
}
"""Requests a node must not get signed, each for one reason."""

WHAT = {
    "another CN": "its subject is 'CN=gpu-02', not exactly 'CN=gpu-01'",
    "O= too": "its subject is 'CN=gpu-01,O=ops', not exactly 'CN=gpu-01'",
    "two CNs": "not exactly 'CN=gpu-01'",
    "a SAN": "it asks for extensions: SubjectAlternativeName (2.5.29.17)",
    "an extension request": "it asks for extensions: BasicConstraints (2.5.29.19)",
    "another attribute": "it carries attributes: 1.2.840.113549.1.9.7",
    "a weak key": "an RSA key of 1024 bits",
    "a bad signature": "it is not signed by its own key",
    "an MD5 signature": "it is signed with md5, which is broken",
}
"""A part of what each refusal says: the reason, so that one refused for another reason does not pass."""


def test_the_honest_request_is_taken(tmp_path: Path) -> None:
    """The positive control: what node-key.sh makes (openssl req -new -subj /CN=<id>) passes the policy."""
    key = tmp_path / "k.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
                   check=True, capture_output=True)
    made = subprocess.run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={NODE}"], check=True,
                          capture_output=True, text=True).stdout
    assert policy.request_problems(x509.load_pem_x509_csr(made.encode()), NODE) == []
    assert isinstance(pki.requested_key(made, NODE), ec.EllipticCurvePublicKey)
    assert pki.requested_key(request(), NODE) == P256.public_key()


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_request_for_anything_else_is_refused_naming_the_node_the_reason_and_the_fix(tmp_path: Path, kind: str) -> None:
    with pytest.raises(CertificateRequestError) as err:
        pki.requested_key(HOSTILE[kind](tmp_path), NODE)
    assert err.value.node == NODE
    assert WHAT[kind] in err.value.message
    assert err.value.fix


# --------------------------------------------------------------------------- through the provider, counting signers


class HostileNode(FakeNode):
    """A fake node whose key-making step answers with ``csr`` (a node that lies), otherwise the fake node itself."""

    csr: str | None = None

    def run(self, script: Script, timeout: float = 900) -> Result:
        if self.csr is not None and script.args[:1] == ("make",):
            return Result(0, f"csr\t{base64.b64encode(self.csr.encode()).decode()}\n", "")
        return super().run(script, timeout)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[HostileNode]:
    fake = HostileNode(tmp_path / "node", hostname=NODE)
    with sessions.use(FakeNodes({ADDR: fake})):
        yield fake


def counting_signer(tmp_path: Path, pki_dir: Path) -> tuple[Path, Path]:
    """A signer command that appends a line to a file for each call, then signs its stdin verbatim (subject and
    extensions as the request asks, plus LLMGW_EXTENSIONS): (the program, the file of calls)."""
    calls, program = tmp_path / "calls", tmp_path / "count-and-sign.sh"
    program.write_text(f"""#!/bin/sh
set -eu
echo call >> {calls}
ext=$(mktemp)
trap 'rm -f "$ext"' EXIT
printf '%s\\n' "$LLMGW_EXTENSIONS" > "$ext"
exec openssl x509 -req -CA {pki_dir}/ca.pem -CAkey {pki_dir}/ca-key.pem -set_serial "0x$LLMGW_SERIAL" \\
  -days 1 -sha256 -extfile "$ext" -copy_extensions copy 2>/dev/null
""")
    program.chmod(0o700)
    return program, calls


def calls_of(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def create(props: dict[str, Any]) -> dict[str, Any]:
    p = ClientCertificateProvider()
    res = p.check({}, props)
    assert res.failures == [], res.failures
    outs = p.create(res.inputs).outs
    assert outs is not None
    return outs


def node_props(pki_dir: Path, signer: dict[str, Any] | None = None) -> dict[str, Any]:
    props = {"node_id": NODE, "pki_dir": str(pki_dir), "validity_hours": 48.0, "renew_before_hours": 1.0,
             "key_origin": "node", "connection": CONN}
    return {**props, "signer": signer} if signer else props


@pytest.fixture
def key_signer_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the pkiDir (and caKey) signer, by node id."""
    seen: list[str] = []
    sign = signing.KeySigner.sign

    def counted(self: signing.KeySigner, req: Any) -> str:
        seen.append(req.node_id)
        return sign(self, req)

    monkeypatch.setattr(signing.KeySigner, "sign", counted)
    return seen


def test_the_counting_signers_are_called_for_an_honest_node(tmp_path: Path, node: HostileNode, pki_dir: Path,
                                                            key_signer_calls: list[str]) -> None:
    """The positive control of the counts below: the real node-key.sh request reaches each signer once."""
    assert create(node_props(pki_dir))["cert_pem"]
    assert key_signer_calls == [NODE]
    program, calls = counting_signer(tmp_path, pki_dir)
    signer = {"kind": "command", "ca_pem": (pki_dir / "ca.pem").read_text(), "command": [str(program)]}
    cert = x509.load_pem_x509_certificate(create(node_props(pki_dir, signer))["cert_pem"].encode())
    assert calls_of(calls) == 1
    assert cert.subject == NODE_NAME


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_request_reaches_no_pki_dir_signer(tmp_path: Path, node: HostileNode, pki_dir: Path,
                                                     key_signer_calls: list[str], kind: str) -> None:
    node.csr = HOSTILE[kind](tmp_path)
    with pytest.raises(CertificateRequestError) as err:
        create(node_props(pki_dir))
    assert err.value.node == NODE and WHAT[kind] in err.value.message and err.value.fix
    assert key_signer_calls == []


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_request_reaches_no_command_signer(tmp_path: Path, node: HostileNode, pki_dir: Path,
                                                     kind: str) -> None:
    program, calls = counting_signer(tmp_path, pki_dir)
    node.csr = HOSTILE[kind](tmp_path)
    signer = {"kind": "command", "ca_pem": (pki_dir / "ca.pem").read_text(), "command": [str(program)]}
    with pytest.raises(CertificateRequestError) as err:
        create(node_props(pki_dir, signer))
    assert err.value.node == NODE and WHAT[kind] in err.value.message and err.value.fix
    assert calls_of(calls) == 0


# --------------------------------------------------------------------------- what a signer returns


def test_a_certificate_signed_with_md5_is_named_as_such(tmp_path: Path) -> None:
    """`openssl x509 -req -md5`: the policy says MD5, not merely that the signature does not verify."""
    ca_key = RSA_2048
    now = dt.datetime.now(dt.UTC)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "md5 test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256()))
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca-key.pem").write_bytes(ca_key.private_bytes(serialization.Encoding.PEM,
                                                               serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()))
    (tmp_path / "node.csr").write_text(request())
    (tmp_path / "ext.cnf").write_text("basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
                                      "extendedKeyUsage = clientAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-md5", "-in", str(tmp_path / "node.csr"), "-CA", str(tmp_path / "ca.pem"),
                    "-CAkey", str(tmp_path / "ca-key.pem"), "-set_serial", "7", "-days", "1",
                    "-extfile", str(tmp_path / "ext.cnf"), "-out", str(tmp_path / "node.pem")],
                   check=True, capture_output=True)
    cert = x509.load_pem_x509_certificate((tmp_path / "node.pem").read_bytes())
    assert isinstance(cert.signature_hash_algorithm, hashes.MD5)  # the positive control: openssl used MD5
    assert policy.check_node_certificate(cert, ca, NODE, P256.public_key(), now) == [
        "it is signed with md5, which is broken"]


def test_what_a_signer_returns_is_held_to_the_exact_subject_and_extensions(pki_dir: Path) -> None:
    """A signer that adds a SAN, or O= to the subject, is refused: the answer is checked like the request."""
    authority = pki.load_authority(str(pki_dir), NODE)
    now = dt.datetime.now(dt.UTC)
    req = signer.request(NODE, request(), dt.timedelta(hours=1), now, authority.cert.not_valid_after_utc)
    good = pki.issue(authority, NODE, dt.timedelta(hours=1), now, P256.public_key())
    assert pki.signed_problems(authority.cert, x509.load_pem_x509_certificate(good.cert_pem.encode()), req, now) == []

    def signed(subject: x509.Name, *extra: x509.ExtensionType) -> x509.Certificate:
        cert = x509.load_pem_x509_certificate(good.cert_pem.encode())
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(cert.issuer)
                   .public_key(P256.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(cert.not_valid_before_utc).not_valid_after(cert.not_valid_after_utc))
        for ext in [*cert.extensions, *(x509.Extension(e.oid, False, e) for e in extra)]:
            builder = builder.add_extension(ext.value, ext.critical)
        return builder.sign(authority.key, hashes.SHA256())  # type: ignore[arg-type]

    san = signed(NODE_NAME, x509.SubjectAlternativeName([x509.DNSName("gpu-02")]))
    assert pki.signed_problems(authority.cert, san, req, now) == [
        "it has extensions a node certificate must not have: SubjectAlternativeName (2.5.29.17)"]
    org = signed(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ops"),
                            x509.NameAttribute(NameOID.COMMON_NAME, NODE)]))
    assert pki.signed_problems(authority.cert, org, req, now) == [
        "its subject is 'CN=gpu-01,O=ops', not exactly 'CN=gpu-01'"]

