"""Only the machine already known is renewed; an operator-made key goes only to a machine vouched for.

On the fake node (tests/fakenode.py: the package's scripts under a temporary
root, host keys checked as the SSH pool checks them). A second FakeNode with
its own host key stands for another machine answering at the node's address.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from pulumi.output import Unknown

from lab import pki as labpki
from llmgw_pulumi import errors
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from llmgw_pulumi.ssh import sessions
from tests.fakenode import FakeNode, FakeNodes
from tests.unit.fake_node_resources import (
    ADDR,
    CONN,
    HOST_KEY,
    KEY,
    PENDING,
    PINNED,
    agent_inputs,
    cert_public,
    certificate,
    engine_inputs,
    identity_inputs,
    public_of,
)
from tests.unit.provider_inputs import checked

OTHER_KEY = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x02" * 32).public_key().public_bytes(
    serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
"""The host key of another machine."""
BASTION = "10.0.0.2:22"
JUMP_CONN = {**CONN, "jump": [{"address": f"deploy@{BASTION}"}]}


@pytest.fixture
def nodes(tmp_path: Path) -> Any:
    """The real node (HOST_KEY) and an impostor (OTHER_KEY), and a FakeNodes answering at ADDR with the real one."""
    real = FakeNode(tmp_path / "real", hostname="gpu-01", host_key=HOST_KEY)
    impostor = FakeNode(tmp_path / "impostor", hostname="gpu-01", host_key=OTHER_KEY)
    fakes = FakeNodes({ADDR: real})
    with sessions.use(fakes):
        yield real, impostor, fakes


def untouched(machine: FakeNode) -> None:
    """Nothing ran on ``machine``: no script, so no key pair made and nothing read."""
    assert machine.runs == [] and machine.files() == [], (machine.runs, machine.files())


def renewal_props(pki_dir: Path, **extra: Any) -> dict[str, Any]:
    """ClientCertificate's inputs inside the renewal window of a certificate from ``certificate()`` (100 h)."""
    return checked(ClientCertificateProvider(), {"node_id": "gpu-01", "pki_dir": str(pki_dir), "validity_hours": 1000.0,
                                                 "renew_before_hours": 200.0, "connection": CONN, **extra})


def reissue_case(case: str, cert: dict[str, Any], pki_dir: Path, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(olds, news) of ClientCertificate's update for each reason to issue again for the same machine."""
    p = ClientCertificateProvider()
    if case == "renewal":
        return cert, renewal_props(pki_dir)
    same = checked(p, {"node_id": "gpu-01", "pki_dir": str(pki_dir), "validity_hours": 100.0,
                       "renew_before_hours": 10.0, "connection": CONN})
    if case == "node key lost":
        return {**cert, "node_key": "gone"}, same
    assert case == "CA rotated"
    labpki.init_ca(tmp_path / "pki2")
    return cert, checked(p, {**same, "pki_dir": str(tmp_path / "pki2")})


@pytest.mark.parametrize("case", ["renewal", "CA rotated", "node key lost"])
def test_another_machine_at_the_address_is_refused_before_anything_is_made_or_signed(
        nodes: Any, pki_dir: Path, tmp_path: Path, case: str) -> None:
    real, impostor, fakes = nodes
    cert = certificate(pki_dir, key_origin="node")
    olds, news = reissue_case(case, cert, pki_dir, tmp_path)
    p = ClientCertificateProvider()
    d = p.diff("id", olds, news)
    assert d.changes and d.replaces == [], "the same machine is updated in place, expecting its recorded host key"

    fakes.nodes[ADDR] = impostor
    with pytest.raises(errors.HostKeyChangedError) as refused:
        p.update("id", olds, news)
    untouched(impostor)
    # The fix says how to confirm the key on the machine itself and how to declare a re-imaged one.
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in refused.value.fix
    assert "replace_with" in refused.value.fix and "--replace" in refused.value.fix and "hostKey" in refused.value.fix
    assert "on its console" in refused.value.fix

    fakes.nodes[ADDR] = real  # the real node back: it renews normally
    renewed = p.update("id", olds, news).outs
    assert renewed["serial"] != cert["serial"] and renewed["host_key"] == HOST_KEY
    assert public_of(real.read(PENDING) or b"") == cert_public(renewed["cert_pem"]), "not the real node's new key"


def test_a_new_address_is_a_new_machine_trusted_on_first_use_unless_pinned(nodes: Any, pki_dir: Path) -> None:
    _, impostor, fakes = nodes
    cert = certificate(pki_dir, key_origin="node")
    p = ClientCertificateProvider()
    moved = checked(p, {**{k: cert[k] for k in ("node_id", "pki_dir", "validity_hours", "renew_before_hours")},
                        "connection": {**CONN, "host": "10.0.0.12"}})
    assert p.diff("id", cert, moved).replaces == ["connection.host"]
    fakes.nodes["10.0.0.12"] = impostor
    assert p.create(moved).outs["host_key"] == OTHER_KEY  # a replacement: first use
    pinned = checked(p, {**moved, "connection": {**moved["connection"], "host_key": HOST_KEY}})
    before = len(impostor.runs)
    with pytest.raises(errors.HostKeyChangedError):
        p.create(pinned)
    assert len(impostor.runs) == before


def test_switching_to_a_key_made_on_the_node_needs_a_host_key_pinned(nodes: Any, pki_dir: Path) -> None:
    real, _, fakes = nodes
    operator_cert = certificate(pki_dir)  # keyOrigin operator: ClientCertificate never reached the node
    p = ClientCertificateProvider()
    switched = checked(p, {"node_id": "gpu-01", "pki_dir": str(pki_dir), "validity_hours": 100.0,
                           "renew_before_hours": 10.0, "key_origin": "node", "connection": CONN})
    with pytest.raises(errors.ConfigError, match="hostKey"):
        p.update("id", operator_cert, switched)
    assert fakes.sessions == 0 and real.runs == []
    outs = p.update("id", operator_cert, checked(p, {**switched, "connection": PINNED})).outs
    assert outs["host_key"] == HOST_KEY and outs["serial"] != operator_cert["serial"] and "key_pem" not in outs


# --------------------------------------------------------------------------- keyOrigin operator (L6)


def test_an_operator_key_is_not_sent_to_a_machine_nobody_vouched_for(nodes: Any, pki_dir: Path) -> None:
    real, _, fakes = nodes
    cert = certificate(pki_dir)
    p = NodeIdentityProvider()
    unpinned = {"node_id": "gpu-01", "connection": CONN, "ca_pem": cert["ca_pem"], "cert_pem": cert["cert_pem"],
                "key_origin": "operator", "key_pem": cert["key_pem"]}
    # The preview of a new node says so already, naming the field and how to read the key safely.
    failures = p.check({}, unpinned).failures
    assert len(failures) == 1 and "hostKey" in failures[0].reason and "on its console" in failures[0].reason
    assert p.check({}, {**unpinned, "connection": PINNED}).failures == []
    assert p.check({}, {**unpinned, "connection": Unknown()}).failures == []  # a preview: create() decides
    # And create() refuses before any connection, whatever check said (a replacement the engine decided on).
    with pytest.raises(errors.ConfigError) as refused:
        p.create({**unpinned, "key_origin": "operator"})
    assert refused.value.field == "hostKey" and "ssh_host_ed25519_key.pub" in refused.value.fix
    assert fakes.sessions == 0 and real.runs == [] and real.read(KEY) is None
    # Pinned: installed.
    outs = p.create(identity_inputs(cert)).outs
    assert real.read(KEY) == cert["key_pem"].encode() and outs["host_key"] == HOST_KEY


def test_an_operator_key_goes_to_the_host_key_recorded_and_only_to_it(nodes: Any, pki_dir: Path) -> None:
    # A stack onboarded unpinned before the guard: NodeIdentity recorded the key; its updates expect it.
    real, impostor, fakes = nodes
    cert = certificate(pki_dir)
    p = NodeIdentityProvider()
    inputs = identity_inputs(cert)
    outs = p.create(inputs).outs
    unpinned = {**inputs, "connection": CONN}
    assert p.check(inputs, unpinned).failures == []  # an existing resource: it has recorded the machine
    renewed = certificate(pki_dir)
    news = {**unpinned, "cert_pem": renewed["cert_pem"], "key_pem": renewed["key_pem"]}
    fakes.nodes[ADDR] = impostor
    with pytest.raises(errors.HostKeyChangedError):
        p.update("gpu-01", outs, news)
    untouched(impostor)
    fakes.nodes[ADDR] = real
    p.update("gpu-01", outs, news)
    assert real.read(KEY) == renewed["key_pem"].encode()


# --------------------------------------------------------------------------- AgentInstall and EngineCheck


def installed_identity(node: FakeNode) -> None:
    node.path("/etc/llmgw").mkdir(mode=0o755, exist_ok=True)


@pytest.mark.parametrize("call", ["create", "update"])
def test_agent_and_engine_check_expect_the_host_key_recorded(nodes: Any, tmp_path: Path, call: str) -> None:
    real, impostor, fakes = nodes
    installed_identity(real)
    build = tmp_path / "llmgw"
    build.write_bytes(b"#!/bin/sh\ncase $1 in --version) echo 'llmgw version v1.2.3-4-gabcdef' ;; esac\n")
    agent, engines = agent_inputs(build), engine_inputs()
    fakes.nodes[ADDR] = impostor
    for provider, inputs in ((AgentInstallProvider(), agent), (EngineCheckProvider(), engines)):
        with pytest.raises(errors.HostKeyChangedError):
            if call == "create":
                provider.create(inputs)
            else:  # the recorded key only in the old outputs: the new inputs' is not known yet (a preview)
                provider.update("gpu-01", inputs, {k: v for k, v in inputs.items() if k != "known_host_key"})
    untouched(impostor)
    fakes.nodes[ADDR] = real
    assert AgentInstallProvider().create(agent).outs["installed_sha256"]
    assert "problems" in EngineCheckProvider().create(engines).outs


@pytest.mark.parametrize("resource", ["agent", "engines"])
def test_agent_and_engine_check_expect_the_jump_host_keys_recorded(nodes: Any, tmp_path: Path, resource: str) -> None:
    real, _, _ = nodes
    installed_identity(real)
    real.jump_host_keys = {BASTION: OTHER_KEY}  # the bastion on the way now presents another key
    build = tmp_path / "llmgw"
    build.write_bytes(b"#!/bin/sh\ncase $1 in --version) echo 'llmgw version v1.2.3-4-gabcdef' ;; esac\n")
    recorded = {"connection": JUMP_CONN, "known_jump_host_keys": {BASTION: HOST_KEY}}
    provider: Any = AgentInstallProvider() if resource == "agent" else EngineCheckProvider()
    inputs = agent_inputs(build, **recorded) if resource == "agent" else checked(provider, {**engine_inputs(), **recorded})
    with pytest.raises(errors.HostKeyChangedError, match="jump host"):
        provider.create(inputs)
    with pytest.raises(errors.HostKeyChangedError, match="jump host"):
        provider.update("gpu-01", inputs, {k: v for k, v in inputs.items() if k != "known_jump_host_keys"})
    assert real.runs == []
    real.jump_host_keys = {BASTION: HOST_KEY}
    provider.create(inputs)
    assert real.runs


# --------------------------------------------------------------------------- declaring a changed key


def test_a_confirmed_new_key_is_declared_by_pinning_it(nodes: Any, pki_dir: Path) -> None:
    # The same machine with new host keys (its identity intact): refused until the new key is pinned.
    real, _, _ = nodes
    cert = certificate(pki_dir, key_origin="node")
    ident = NodeIdentityProvider()
    inputs = identity_inputs(cert)
    outs = ident.create(inputs).outs
    real.host_key = OTHER_KEY
    with pytest.raises(errors.HostKeyChangedError):
        ident.update("gpu-01", outs, {**inputs, "connection": CONN, "cert_pem": cert["cert_pem"]})
    pinned_conn = {**CONN, "host_key": OTHER_KEY}
    p = ClientCertificateProvider()
    news = checked(p, {**{k: cert[k] for k in ("node_id", "pki_dir", "validity_hours", "renew_before_hours")},
                       "connection": pinned_conn})
    carried = p.update("id", cert, news).outs  # the pin recorded, nothing issued
    assert carried["serial"] == cert["serial"] and carried["connection"]["host_key"] == OTHER_KEY
    assert p.read("id", carried).outs["node_key"] == "held"  # read with the pin: the same machine
    updated = ident.update("gpu-01", outs, checked(ident, {**inputs, "connection": pinned_conn})).outs
    assert updated["host_key"] == OTHER_KEY


def test_a_delete_runs_nothing_on_a_machine_it_does_not_know(nodes: Any, pki_dir: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # A re-imaged machine declared by replacing the node's resources: the old ones' deletes meet the new host key.
    real, impostor, fakes = nodes
    cert = certificate(pki_dir, key_origin="node")
    outs = NodeIdentityProvider().create(identity_inputs(cert)).outs
    fakes.nodes[ADDR] = impostor
    NodeIdentityProvider().delete("gpu-01", outs)
    untouched(impostor)
    assert "nothing was removed from it" in caplog.text and "presented another host key" in caplog.text
    fakes.nodes[ADDR] = real  # positive control: on the machine it knows, the delete removes the identity
    NodeIdentityProvider().delete("gpu-01", outs)
    assert real.read(KEY) is None


def test_a_renewal_through_a_bastion_expects_the_bastions_recorded_key(nodes: Any, pki_dir: Path) -> None:
    real, _, _ = nodes
    real.jump_host_keys = {BASTION: HOST_KEY}
    p = ClientCertificateProvider()
    cert = p.create(checked(p, {"node_id": "gpu-01", "pki_dir": str(pki_dir), "validity_hours": 100.0,
                                "renew_before_hours": 10.0, "key_origin": "node", "connection": JUMP_CONN})).outs
    assert cert["jump_host_keys"] == {BASTION: HOST_KEY}
    real.jump_host_keys = {BASTION: OTHER_KEY}  # another machine answers as the bastion
    runs = len(real.runs)
    news = renewal_props(pki_dir, connection=JUMP_CONN)
    with pytest.raises(errors.HostKeyChangedError, match="jump host"):
        p.update("id", cert, news)
    assert len(real.runs) == runs
    real.jump_host_keys = {BASTION: HOST_KEY}
    assert p.update("id", cert, news).outs["serial"] != cert["serial"]
