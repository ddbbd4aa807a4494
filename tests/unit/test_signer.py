"""llmgw:signer: the signers (a key here, a real SoftHSM2 token through the shipped script, a broken command), and
the check every returned certificate passes before it is used."""

from __future__ import annotations

import datetime as dt
import stat
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab import pki as labpki
from lab.hsm import SIGNER, Token
from llmgw_pulumi.certificates import pki, signer, signing
from llmgw_pulumi.errors import SignedCertificateError, SignerError
from llmgw_pulumi.providers.certificate import CA_KEY_INPUT, ClientCertificateProvider, _ca_keys
from tests.unit import RELEASE_KEY

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


@pytest.fixture
def ca(tmp_path: Path) -> pki.Authority:
    labpki.init_ca(tmp_path)
    return pki.load_authority(str(tmp_path), "gpu-01")  # now: the CA was made after NOW (import) on a slow run


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> Token:
    return Token.create(tmp_path_factory.mktemp("hsm") / "token")


def node_request(node: str = "gpu-01", validity: dt.timedelta = DAY,
                 ca_end: dt.datetime = NOW + 3650 * DAY) -> tuple[signer.SigningRequest, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
           .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode())
    return signer.request(node, csr, validity, NOW, ca_end), key


def test_a_key_signer_issues_what_was_asked_and_passes_the_check(ca: pki.Authority) -> None:
    req, key = node_request()
    got = pki.accept_signed(ca.cert, signing.KeySigner(ca).sign(req), req, NOW)
    cert = x509.load_pem_x509_certificate(got.cert_pem.encode())
    assert cert.public_key() == key.public_key()
    assert cert.not_valid_after_utc == req.not_after


def _forged(ca: pki.Authority, req: signer.SigningRequest, **change: object) -> str:
    """A certificate for ``req``, signed by ``ca`` (or change['by']), with one thing other than asked."""
    asked = x509.load_pem_x509_csr(req.csr_pem.encode()).public_key()
    by = change.get("by", ca.key)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(change.get("cn", req.node_id)))]))
         .issuer_name(ca.cert.subject).public_key(change.get("key", asked))  # type: ignore[arg-type]
         .serial_number(x509.random_serial_number()).not_valid_before(req.not_before)
         .not_valid_after(change.get("not_after", req.not_after))  # type: ignore[arg-type]
         .add_extension(x509.BasicConstraints(ca=bool(change.get("is_ca", False)), path_length=None), critical=True)
         .add_extension(x509.KeyUsage(True, False, False, False, False, bool(change.get("cert_sign", False)),
                                      False, False, False), critical=True)
         .add_extension(x509.ExtendedKeyUsage(change.get("eku", [ExtendedKeyUsageOID.CLIENT_AUTH])),  # type: ignore[arg-type]
                        critical=False))
    return b.sign(by, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()  # type: ignore[arg-type]


def test_the_forger_itself_makes_an_acceptable_certificate_unchanged(ca: pki.Authority) -> None:
    req, _ = node_request()
    assert pki.accept_signed(ca.cert, _forged(ca, req), req, NOW).serial  # the positive control of the next test


@pytest.mark.parametrize("change,named", [
    ({"cn": "gpu-02"}, "its common name is 'gpu-02', not 'gpu-01'"),
    ({"is_ca": True}, "CA:TRUE"),
    ({"cert_sign": True}, "KeyUsage also allows key_cert_sign"),
    ({"eku": [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]}, "clientAuth only"),
    ({"eku": [ExtendedKeyUsageOID.SERVER_AUTH]}, "clientAuth only"),
    ({"key": ec.generate_private_key(ec.SECP256R1()).public_key()}, "its key is not the key it was asked for"),
    ({"not_after": NOW + 30 * DAY}, "longer than"),
    ({"by": ec.generate_private_key(ec.SECP256R1())}, "not signed by the cluster CA"),
])
def test_a_signer_that_returns_anything_else_is_refused_naming_what_was_wrong(ca: pki.Authority, change: dict[str, object],
                                                                              named: str) -> None:
    req, _ = node_request()
    with pytest.raises(SignedCertificateError) as err:
        pki.accept_signed(ca.cert, _forged(ca, req, **change), req, NOW)
    assert named in str(err.value) and "gpu-01" in str(err.value)


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "signer.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_the_hsm_signer_signs_through_the_token_and_its_key_never_leaves_it(token: Token, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in token.signer_env().items():
        monkeypatch.setenv(k, v)
    now = dt.datetime.now(dt.UTC)
    ca = pki.ca_certificate(token.ca_pem.read_text(), "gpu-01", now)
    req, key = node_request(validity=dt.timedelta(hours=3))  # not whole days: openssl ca takes exact dates
    got = pki.accept_signed(ca, signer.CommandSigner((str(SIGNER),)).sign(req), req, now)
    cert = x509.load_pem_x509_certificate(got.cert_pem.encode())
    assert cert.public_key() == key.public_key() and cert.not_valid_after_utc == req.not_after
    attributes = token.private_key_attributes()
    assert "sensitive" in attributes and "never extractable" in attributes, attributes


def test_a_token_that_refuses_the_pin_is_an_error_quoting_the_signer(token: Token, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in token.signer_env(pin="wrong-pin").items():
        monkeypatch.setenv(k, v)
    req, _ = node_request()
    with pytest.raises(SignerError) as err:
        signer.CommandSigner((str(SIGNER),)).sign(req)
    text = str(err.value)
    assert "gpu-01" in text and "failed (exit status 1)" in text and "fix:" in text
    assert "wrong-pin" not in text


def test_the_signer_gets_the_csr_on_stdin_and_the_request_in_its_environment_not_argv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the language host hands the program in confidence: the stack's decrypted config, and its passphrase.
    monkeypatch.setenv("PULUMI_CONFIG", '{"llmgw:caKey": "the CA key\'s text"}')
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "the stack's passphrase")
    monkeypatch.setenv("PKCS11_PIN_FOR_THE_SIGNER", "1234")
    seen = tmp_path / "seen"
    prog = script(tmp_path, f'env > {seen}.env; cat > {seen}.csr; echo "$@" > {seen}.argv; exit 3\n')
    req, _ = node_request()
    with pytest.raises(SignerError):
        signer.CommandSigner((str(prog), "--profile", "node")).sign(req)
    env = dict(line.split("=", 1) for line in Path(f"{seen}.env").read_text().splitlines() if "=" in line)
    assert env[signer.ENV_NODE_ID] == "gpu-01" and env[signer.ENV_SUBJECT] == "/CN=gpu-01"
    assert env[signer.ENV_NOT_AFTER_ASN1] == f"{req.not_after:%Y%m%d%H%M%SZ}"
    assert Path(f"{seen}.csr").read_text() == req.csr_pem
    assert Path(f"{seen}.argv").read_text().strip() == "--profile node"
    assert "PULUMI_CONFIG" not in env and "PULUMI_CONFIG_PASSPHRASE" not in env
    assert env["PKCS11_PIN_FOR_THE_SIGNER"] == "1234"  # the operator's own settings for the signer still reach it


@pytest.mark.parametrize("body,named", [
    ("echo 'token busy: try later' >&2; exit 2\n", "exit status 2); it said:\ntoken busy: try later"),
    ("echo all fine\n", "printed no PEM certificate"),
    ("sleep 5\n", "no answer within 0.5 s"),
])
def test_a_failing_signer_is_a_clear_error(tmp_path: Path, body: str, named: str) -> None:
    req, _ = node_request()
    with pytest.raises(SignerError) as err:
        signer.CommandSigner((str(script(tmp_path, body)),), timeout_seconds=0.5).sign(req)
    assert named in str(err.value) and str(err.value).startswith("gpu-01:")


def test_a_missing_or_unexecutable_signer_is_found_before_the_node_is_reached(tmp_path: Path, ca: pki.Authority) -> None:
    spec = signer.SignerSpec(kind="command", ca_pem=ca.cert_pem, command=(str(tmp_path / "nope"),))
    with pytest.raises(SignerError, match="does not exist"):
        signing.chosen(spec, "gpu-01", None, None, NOW)
    prog = script(tmp_path, "exit 0\n")
    prog.chmod(stat.S_IRUSR)
    with pytest.raises(SignerError, match="not executable"):
        signer.CommandSigner((str(prog),)).ready("gpu-01")


def test_signer_calls_run_in_parallel_within_their_bound(tmp_path: Path) -> None:
    argv = (str(tmp_path / "any"),)
    inside, most = 0, 0
    lock = threading.Lock()

    def one() -> None:
        nonlocal inside, most
        with signer.slot(argv, 2):
            with lock:
                inside += 1
                most = max(most, inside)
            time.sleep(0.2)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 2


def test_config_problems_are_named() -> None:
    assert signer.problems(None) == []
    names = [p[0] for p in signer.problems({"kind": "command", "command": ["relative-signer"]})]
    assert names == ["signer.ca", "signer.command"]
    assert [p[0] for p in signer.problems({"kind": "vault"})] == ["signer.kind"]


def test_the_ca_key_input_is_taken_out_of_the_recorded_inputs(ca: pki.Authority) -> None:
    key_pem = ca.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # type: ignore[attr-defined]
                                   serialization.NoEncryption()).decode()
    news = {"node_id": "gpu-07", "key_origin": "operator", "validity_hours": 100.0, "renew_before_hours": 10.0,
            "signer": {"kind": "caKey", "ca_pem": ca.cert_pem}, CA_KEY_INPUT: key_pem}
    p = ClientCertificateProvider()
    res = p.check({}, news)
    assert not res.failures, res.failures
    assert CA_KEY_INPUT not in res.inputs and key_pem not in repr(res.inputs)
    assert _ca_keys["gpu-07"] == key_pem
    outs = p.create(res.inputs).outs
    assert key_pem not in repr(outs) and pki.verify_issued(ca.cert_pem, outs["cert_pem"])


BASE = {"servers": ["cp1.example.net:7443"], "agent": {"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://r.example.net/llmgw"},
        "ssh": {"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519"},
        "nodes": [{"id": "gpu-01", "address": "10.0.0.11"}]}


def test_the_stack_config_takes_a_signer_instead_of_a_pki_dir() -> None:
    from llmgw_pulumi.config import stack_config

    spec = stack_config.parse({**BASE, "signer": {"kind": "command", "ca": "/srv/ca.pem", "command": ["/usr/bin/sign"],
                                                  "maxParallel": 2}})
    assert spec.pki_dir is None and spec.signer is not None
    assert spec.signer.command == ("/usr/bin/sign",) and spec.signer.max_parallel == 2
    with pytest.raises(stack_config.StackConfigError) as err:
        stack_config.parse(BASE)
    assert ("llmgw", "pkiDir") in [p[:2] for p in err.value.problems]


@pytest.mark.parametrize("signer_config,has_key,field", [
    ({"kind": "caKey", "ca": "/srv/ca.pem"}, False, "caKey"),
    ({"kind": "command", "ca": "/srv/ca.pem", "command": "sign --pin 1234"}, False, "signer.command"),
    ({"kind": "command", "command": ["/usr/bin/sign"]}, False, "signer.ca"),
    ({"kind": "hsm", "ca": "/srv/ca.pem"}, False, "signer.kind"),
    ({"kind": "command", "ca": "/srv/ca.pem", "command": ["/s"], "timeout": 5}, False, "signer.timeout"),
])
def test_a_bad_signer_config_is_named(signer_config: dict[str, object], has_key: bool, field: str) -> None:
    from llmgw_pulumi.config import stack_config

    with pytest.raises(stack_config.StackConfigError) as err:
        stack_config.parse({**BASE, "signer": signer_config}, has_ca_key=has_key)
    assert field in [p[1] for p in err.value.problems], err.value.problems


def test_a_ca_key_signer_with_its_secret_is_accepted() -> None:
    from llmgw_pulumi.config import stack_config

    spec = stack_config.parse({**BASE, "signer": {"kind": "caKey", "ca": "/srv/ca.pem"}}, has_ca_key=True)
    assert spec.signer is not None and spec.signer.kind == "caKey"


def test_the_program_reads_the_ca_from_a_path_or_takes_its_text(ca: pki.Authority, tmp_path: Path) -> None:
    from llmgw_pulumi.config import stack_config
    from llmgw_pulumi.errors import ConfigError
    from llmgw_pulumi.stack import program

    (tmp_path / "ca.pem").write_text(ca.cert_pem)
    by_path = program.signer_inputs(stack_config.SignerConfig("command", str(tmp_path / "ca.pem"), ("/usr/bin/sign",)))
    by_text = program.signer_inputs(stack_config.SignerConfig("command", ca.cert_pem, ("/usr/bin/sign",)))
    assert by_path == by_text == {"kind": "command", "ca_pem": ca.cert_pem, "command": ["/usr/bin/sign"]}
    assert program.signer_inputs(stack_config.SignerConfig("pkiDir")) is None  # as stacks before llmgw:signer
    with pytest.raises(ConfigError, match="signer.ca: cannot read"):
        program.signer_inputs(stack_config.SignerConfig("command", str(tmp_path / "gone.pem"), ("/usr/bin/sign",)))
