"""The CA key in an HSM (SoftHSM2), signing through examples/signers/openssl-pkcs11.sh; a CI runner that takes a
fleet over with only the signer (the CA-custody issue).

Under the real engine and CLI on real-systemd hosts. The control plane of the
HSM tests trusts the token's CA only (its own server certificate is signed
through the token too), so an agent that connects holds a certificate the HSM
signed.

The operator's side is the test's tmp dir: the project directories,
PULUMI_HOME, the file backend, the token directory; plus, with pkiDir, the PKI
dir (the negative control: there the assertion that no CA private key is on
the operator's side fails, on ca-key.pem).
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from lab import pki as labpki
from lab import seed
from lab.control_plane import ControlPlane
from lab.hsm import SIGNER, Token
from lab.stack import LabStack, engine_env
from llmgw_pulumi.certificates import pki
from tests.conftest import RELEASE, REPO, ssh, stack_config, wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

CERT_PATH = "/etc/llmgw/agent.pem"
RENEW_EVERY_UP = {"validityHours": 1, "renewBeforeHours": 0.999}
"""Renewal is due 3.6 s after a certificate is issued."""


def main_pid(host: Any, cluster: Any) -> str:
    return ssh(host, cluster, "systemctl show -p MainPID --value llmgw-agent")[1].strip()


def serial(host: Any) -> int:
    return x509.load_pem_x509_certificate(host.read_file(CERT_PATH) or b"").serial_number


def private_keys_under(roots: list[Path]) -> list[str]:
    """Every file under ``roots`` that holds a PEM private key (any kind: PKCS#8, EC, RSA, encrypted, OpenSSH)."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and b"PRIVATE KEY-----" in path.read_bytes():
                found.append(str(path))
    return found


def assert_no_ca_key_on_the_operators_side(roots: list[Path], env: dict[str, str], token: Token | None) -> None:
    found = private_keys_under(roots)
    assert found == [], f"a PEM private key on the operator's side: {found}"
    held = [k for k, v in {**os.environ, **env}.items() if "PRIVATE KEY-----" in v]
    assert held == [], f"a private key in the operator's environment: {held}"
    if token is not None:
        attributes = token.private_key_attributes()
        assert "sensitive" in attributes and "never extractable" in attributes, attributes
        assert "always sensitive" in attributes, attributes


class Planes:
    """The HSM tests' control plane: it trusts the CAs given only, and its certificate is signed through a token."""

    def __init__(self, lab: Any, work: Path) -> None:
        self.lab, self.work, self.plane = lab, work, None

    def start(self, trusted: list[Token], signed_by: Token) -> ControlPlane:
        port = 0
        if self.plane is not None:
            port = self.plane.port
            self.plane.stop()
        pki_dir = self.work / f"plane-pki-{signed_by.object}"
        pki_dir.mkdir(exist_ok=True)
        (pki_dir / "ca.pem").write_text("".join(t.ca_pem.read_text() for t in trusted))
        self.plane = ControlPlane(pki_dir, self.lab.gateway, port=port, server_cert=signed_by.server_cert).start()
        return self.plane


@pytest.fixture
def hsm(lab: Any, tmp_path: Path) -> Any:
    """A token holding the CA key, and a control plane that trusts only that CA."""
    token = Token.create(tmp_path / "hsm")
    planes = Planes(lab, tmp_path)
    planes.start([token], token)
    yield token, planes
    if planes.plane is not None:
        planes.plane.stop()


def hsm_config(cluster: Any, hosts: list[Any], plane: ControlPlane, ca: Path, **top: Any) -> dict[str, Any]:
    config = stack_config(cluster, hosts, servers=[plane.address],
                          signer={"kind": "command", "ca": str(ca), "command": [str(SIGNER)],
                                  "maxParallel": 1},  # SoftHSM2 fails concurrent processes
                          **top)
    del config["pkiDir"]
    # The node trusts the HSM's CA only, and the lab's release server has the lab CA's certificate: the operator
    # fetches the release (trusting the lab CA) and pushes it.
    config["agent"] = {**config["agent"], "fetch": "operator"}
    return config


def test_onboarding_renewal_and_ca_rotation_through_the_hsm_signer(cluster, hosts, new_stack, hsm, tmp_path):
    token, planes = hsm
    plane = planes.plane
    (h,) = hosts(1)
    stack = new_stack(hsm_config(cluster, [h], plane, token.ca_pem, certificate=RENEW_EVERY_UP))
    stack.env.update(token.signer_env())

    up = stack.up()
    assert up.ok, up.output
    ca_pem = token.ca_pem.read_text()
    assert pki.verify_issued(ca_pem, (h.read_file(CERT_PATH) or b"").decode())
    assert wait_until(lambda: h.hostname in plane.connected(), 20), "the agent did not connect with the HSM's certificate"
    first = serial(h)

    time.sleep(4)  # renewal is due
    renewed = stack.up()
    assert renewed.ok, renewed.output
    assert serial(h) != first and pki.verify_issued(ca_pem, (h.read_file(CERT_PATH) or b"").decode())

    # CA rotation: a new CA, its key made in the same token; the control plane trusts both while nodes move over.
    new = token.rotated("llmgw HSM CA 2")
    plane = planes.start([token, new], new)
    stack.set_config(hsm_config(cluster, [h], plane, new.ca_pem))
    stack.env.update(new.signer_env())
    rotated_ca = new.ca_pem
    before_rotation = serial(h)
    rotated = stack.up()
    assert rotated.ok, rotated.output
    node_ca = (h.read_file("/etc/llmgw/ca.pem") or b"").decode()
    assert node_ca == rotated_ca.read_text(), "the node was not given the new CA"
    assert serial(h) != before_rotation and pki.verify_issued(node_ca, (h.read_file(CERT_PATH) or b"").decode())
    assert wait_until(lambda: h.hostname in plane.connected(), 20)

    home, backend = Path(stack.env["PULUMI_HOME"]), Path(stack.env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    assert_no_ca_key_on_the_operators_side([stack.work_dir, home, backend, token.dir], stack.env, token)
    assert_no_ca_key_on_the_operators_side([], stack.env, new)


def test_the_no_ca_key_assertion_fails_with_pki_dir(cluster, hosts, new_stack):
    """The negative control: the same assertion over a pkiDir operator's side finds the CA key."""
    (h,) = hosts(1)
    stack = new_stack(stack_config(cluster, [h]))
    up = stack.up()
    assert up.ok, up.output
    home, backend = Path(stack.env["PULUMI_HOME"]), Path(stack.env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    roots = [stack.work_dir, home, backend]
    assert_no_ca_key_on_the_operators_side(roots, stack.env, None)  # state and project: no key (keyOrigin node)
    with pytest.raises(AssertionError, match="ca-key.pem"):
        assert_no_ca_key_on_the_operators_side([*roots, cluster.pki_dir], stack.env, None)


def ci_checkout(cluster: Any, first: LabStack, tmp_path: Path, config: dict[str, Any]) -> LabStack:
    """A second operator: another PULUMI_HOME, a clean copy of the project, the same state backend and stack."""
    backend = Path(first.env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    env = engine_env(cluster.engine_bin, tmp_path / "ci-pulumi-home", backend)
    env["SSL_CERT_FILE"] = str(cluster.pki_dir / "ca.pem")
    work = tmp_path / "ci-project"
    (work / "stacks").mkdir(parents=True)
    shutil.copy(first.config_path, work / "stacks" / first.config_path.name)  # its encryption salt
    ci = LabStack(work, first.name, env, REPO)
    ci.set_config(config)
    return ci


def failing_signer(tmp_path: Path) -> Path:
    """A signer that cannot sign: a takeover that needed a signature would fail."""
    path = tmp_path / "no-signing.sh"
    path.write_text("#!/bin/sh\necho 'this runner must not sign' >&2\nexit 1\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("onboarded_by", ["pulumi", "script"])
def test_a_ci_runner_with_only_the_signer_takes_the_fleet_over_changing_nothing(cluster, hosts, new_stack, tmp_path,
                                                                                onboarded_by):
    nodes = hosts(2)
    first_config = stack_config(cluster, nodes)
    if onboarded_by == "script":
        binary = seed.operator_binary(tmp_path / "operator" / "llmgw", RELEASE)
        with seed.openssh_env(cluster.ssh_key_path) as env:
            for h in nodes:
                done = seed.onboard(h.hostname, h.addr, env, server=cluster.control_plane.address,
                                    pki_dir=cluster.pki_dir, binary=binary, release_url=cluster.release_url, ssh_wait=30)
                assert done.returncode == 0, done.stdout + done.stderr
        first = new_stack(first_config)
        first.cli("stack", "ls")  # the stack exists in the backend, with nothing in it
    else:
        first = new_stack(first_config)
        up = first.up()
        assert up.ok, up.output
    assert wait_until(lambda: {h.hostname for h in nodes} <= cluster.control_plane.connected(), 30)
    serials = {h.hostname: serial(h) for h in nodes}
    pids = {h.hostname: main_pid(h, cluster) for h in nodes}
    events = len(cluster.control_plane.events)

    ci_config = stack_config(cluster, nodes, signer={"kind": "command", "ca": str(cluster.pki_dir / "ca.pem"),
                                                     "command": [str(failing_signer(tmp_path))]})
    del ci_config["pkiDir"]
    ci = ci_checkout(cluster, first, tmp_path, ci_config)

    if onboarded_by == "pulumi":
        # A reviewer's preview: neither the key nor a working signer is reachable; nothing to change.
        preview = ci.preview(expect_no_changes=True)
        assert preview.ok, preview.output
    up = ci.up()
    assert up.ok, up.output
    assert "this runner must not sign" not in up.output
    assert {h.hostname: serial(h) for h in nodes} == serials, "re-issued"
    assert {h.hostname: main_pid(h, cluster) for h in nodes} == pids, "an agent was restarted"
    new_events = cluster.control_plane.events[events:]
    names = {h.hostname for h in nodes}
    assert [e for e in new_events if e.node_id in names or e.cn in names] == [], "a stream was closed or opened again"
    again = ci.preview(expect_no_changes=True)
    assert again.ok, again.output
    assert labpki.CA_KEY not in {p.name for p in (tmp_path / "ci-project").rglob("*")}


def test_the_ca_key_as_a_stack_secret_signs_and_never_reaches_state(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h], signer={"kind": "caKey", "ca": str(cluster.pki_dir / "ca.pem")})
    del config["pkiDir"]
    stack = new_stack(config)
    key_pem = (cluster.pki_dir / labpki.CA_KEY).read_text()
    stack.config_set("llmgw:caKey", key_pem, secret=True)
    up = stack.up()
    assert up.ok, up.output
    assert pki.verify_issued((cluster.pki_dir / "ca.pem").read_text(), (h.read_file(CERT_PATH) or b"").decode())
    lines = [line for line in key_pem.splitlines() if line and not line.startswith("-----")]
    shown = stack.cli("stack", "export", "--show-secrets").stdout  # even decrypted, state holds no CA key
    leaked = [line for line in lines if line in shown or line in stack.export_raw()]
    assert lines and not leaked, f"{len(leaked)} lines of the CA key are in state"
    (cert,) = [r for r in stack.export()["resources"] if r["type"].endswith("ClientCertificate")]
    assert "ca_key" not in cert.get("inputs", {}) and "ca_key" not in cert.get("outputs", {})
    assert not [line for line in lines if line in up.output], "the CA key is in the CLI's output"
    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output


def test_a_signer_that_fails_changes_nothing_on_the_node_and_the_next_up_recovers(cluster, hosts, new_stack, hsm,
                                                                                  tmp_path):
    token, planes = hsm
    (h,) = hosts(1)
    stack = new_stack(hsm_config(cluster, [h], planes.plane, token.ca_pem, certificate=RENEW_EVERY_UP))
    stack.env.update(token.signer_env())
    up = stack.up()
    assert up.ok, up.output
    held = {p: h.read_file(p) for p in ("/etc/llmgw/agent.pem", "/etc/llmgw/agent-key.pem")}
    pid = main_pid(h, cluster)
    silent = tmp_path / "silent.sh"
    silent.write_text("#!/bin/sh\ncat >/dev/null\necho done\n")
    silent.chmod(0o755)
    failures = {
        "a token that refuses the PIN": ({"LLMGW_PKCS11_PIN": "wrong-pin"}, str(SIGNER), "PIN incorrect"),
        "a signer that prints no certificate": ({}, str(silent), "exited 0 but printed no PEM certificate"),
        "a missing signer": ({}, str(tmp_path / "no-such-signer"), "does not exist on this machine"),
    }
    for what, (env, command, said) in failures.items():
        time.sleep(4)  # renewal is due: the signer is called
        config = hsm_config(cluster, [h], planes.plane, token.ca_pem, certificate=RENEW_EVERY_UP)
        config["signer"]["command"] = [command]
        stack.set_config(config)
        stack.env.update({**token.signer_env(), **env})
        failed = stack.up()
        assert not failed.ok, what
        assert said in failed.output and "ClientCertificate" in failed.output and "fix:" in failed.output, what
        assert {p: h.read_file(p) for p in held} == held, f"{what}: the node's identity changed"
        assert main_pid(h, cluster) == pid, f"{what}: the agent was restarted"
    stack.set_config(hsm_config(cluster, [h], planes.plane, token.ca_pem, certificate=RENEW_EVERY_UP))
    stack.env.update(token.signer_env())
    recovered = stack.up()
    assert recovered.ok, recovered.output
    assert h.read_file("/etc/llmgw/agent.pem") != held["/etc/llmgw/agent.pem"]
    assert h.read_file("/etc/llmgw/agent-key.pending.pem") is None, "a pending key was left behind"
    assert wait_until(lambda: h.hostname in planes.plane.connected(), 20)


OPENSSL_ASKING_MORE = """#!/bin/sh
# The node's openssl, but every request it makes also asks for another node's name.
if [ "$1" = req ]; then exec /usr/bin/openssl "$@" -addext subjectAltName=DNS:gpu-other; fi
exec /usr/bin/openssl "$@"
"""


def test_a_node_request_for_more_than_its_name_reaches_no_signer(cluster, hosts, new_stack, tmp_path):
    """A node whose key-making asks for a SAN too (its openssl replaced): `pulumi up` refuses the request, naming
    the node and the SAN, and the command signer, which counts its calls, is never run. The control: the same node
    with its own openssl again reaches the signer once."""
    (h,) = hosts(1)
    rc, out = ssh(h, cluster, "command -v openssl && test -x /usr/bin/openssl")
    assert rc == 0 and out.strip() != "/usr/local/bin/openssl", out
    rc, out = ssh(h, cluster, f"printf '%s' {shlex.quote(OPENSSL_ASKING_MORE)} | sudo tee /usr/local/bin/openssl "
                              ">/dev/null && sudo chmod 0755 /usr/local/bin/openssl && sudo sh -c 'command -v openssl'")
    assert rc == 0 and out.strip() == "/usr/local/bin/openssl", out  # what the node's scripts run as root
    calls = tmp_path / "signer-calls"
    signer = tmp_path / "counting-signer.sh"
    signer.write_text(f"#!/bin/sh\necho call >> {calls}\necho 'the counting signer signs nothing' >&2\nexit 1\n")
    signer.chmod(0o700)
    config = stack_config(cluster, [h], signer={"kind": "command", "ca": str(cluster.pki_dir / "ca.pem"),
                                                "command": [str(signer)]})
    del config["pkiDir"]
    stack = new_stack(config)
    up = stack.up()
    assert not up.ok
    assert "certificate signing request is refused" in up.output and "SubjectAlternativeName" in up.output, up.output
    assert h.hostname in up.output
    assert not calls.exists(), "the signer was run"

    rc, out = ssh(h, cluster, "sudo rm /usr/local/bin/openssl")
    assert rc == 0, out
    again = stack.up()
    assert not again.ok and "the counting signer signs nothing" in again.output, again.output
    assert calls.read_text().splitlines() == ["call"]
