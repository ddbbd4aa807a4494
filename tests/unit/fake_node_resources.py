"""The four resources' providers run against a fake node (tests/fakenode.py): the node's address, connection and
host key, the files they install there, each resource's inputs for it, and readers of what they left.
tests/unit/conftest.py's ``node``, ``agent_node``, ``pki_dir`` and ``dev_build`` fixtures set the node up."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab.release_server import publish_release
from llmgw_pulumi.nodestate import desired
from llmgw_pulumi.nodestate.observed import Observed
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from tests.fakenode import FakeNode
from tests.unit import fake_pem
from tests.unit.provider_inputs import checked

ADDR = "10.0.0.11"
CONN = {"host": ADDR, "user": "deploy", "port": 22.0, "wait": 5.0, "private_key": fake_pem("OPENSSH PRIVATE KEY", "K")}
CA, CERT, KEY = "/etc/llmgw/ca.pem", "/etc/llmgw/agent.pem", "/etc/llmgw/agent-key.pem"
HOST_KEY = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x01" * 32).public_key().public_bytes(
    serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
"""The fake node's host key: a real one, so that a test can pin it as an operator would (``hostKey``)."""
PINNED = {**CONN, "host_key": HOST_KEY}
"""The connection with the node's host key pinned: what keyOrigin operator needs before its key is sent."""


def agent_binary(version: str, starts: bool = True) -> bytes:
    """A stand-in llmgw: answers --version; as `agent` it comes up (exit 0) or crashes (exit 1, one line on stderr)."""
    agent = "exit 0" if starts else "echo 'llmgw: fatal: simulated fault' >&2; exit 1"
    return (f"#!/bin/sh\ncase $1 in --version) echo 'llmgw version {version}' ;; agent) {agent} ;; esac\n").encode()


def files(outs: dict[str, Any]) -> dict[str, str]:
    """path -> ``"<hex sha256> <mode> <owner>"`` (or ``absent``) of the file the resource last saw there, from its
    ``observed`` output (which keeps it by file name, with a shorter digest)."""
    seen = Observed.parse(outs["observed"])
    assert seen is not None, outs["observed"]
    return {path: f"{s.sha256} {s.mode:o} {s.owner}" if s else "absent" for path, s in seen.files.items()}


def sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def certificate(pki_dir: Path, node_id: str = "gpu-01", key_origin: str = "operator") -> dict[str, Any]:
    """A certificate as ClientCertificate issues it: keyOrigin operator (a key in its outputs) unless told
    ``node`` (the fake node makes the key pair; it must be installed, see the ``node`` fixture)."""
    p = ClientCertificateProvider()
    props = {"node_id": node_id, "pki_dir": str(pki_dir), "validity_hours": 100.0, "renew_before_hours": 10.0,
             "key_origin": key_origin, **({"connection": CONN} if key_origin == "node" else {})}
    return p.create(checked(p, props)).outs


def identity_inputs(cert: dict[str, Any], node_id: str = "gpu-01") -> dict[str, Any]:
    """NodeIdentity's inputs for ``cert``; with keyOrigin operator the node's host key is pinned, as it must be
    before a key made here is sent (ClientCertificate recorded none)."""
    on_node = cert["key_origin"] == "node"
    return checked(NodeIdentityProvider(), {
        "node_id": node_id, "connection": CONN if on_node else PINNED, "ca_pem": cert["ca_pem"],
        "cert_pem": cert["cert_pem"],
        "key_origin": cert["key_origin"],
        **({"known_host_key": cert["host_key"]} if on_node else {"key_pem": cert["key_pem"]})})


def onboard_identity(pki_dir: Path, node_id: str = "gpu-01") -> tuple[dict[str, Any], dict[str, Any]]:
    inputs = identity_inputs(certificate(pki_dir, node_id), node_id)
    return inputs, NodeIdentityProvider().create(inputs).outs


def agent_inputs(binary_path: Path | None = None, **extra: Any) -> dict[str, Any]:
    props: dict[str, Any] = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY,
                             "hostname": "gpu-01", "servers": ["cp1.example.net:7443"]}
    if binary_path is not None:
        props.update(version="v1.2.3-4-gabcdef", binary_path=str(binary_path), binary_sha256=sha(binary_path.read_bytes()))
    props.update(extra)
    return checked(AgentInstallProvider(), props)


def changes_to_systemd(node: FakeNode) -> list[str]:
    """The systemctl calls that change something (reading a unit's state does not)."""
    return [c for c in node.calls("systemctl") if c.split()[1] not in ("is-active", "is-enabled")]


def publish(node: FakeNode, tag: str, binary: bytes, tamper: bytes | None = None) -> None:
    publish_release(node.releases, tag, {"amd64": binary}, tamper={"amd64": tamper} if tamper else None)


def engine_inputs(fail: bool = False, **engines: dict[str, str]) -> dict[str, Any]:
    return checked(EngineCheckProvider(), {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY,
                                           "engines": engines, "fail_on_problems": fail})


PENDING = desired.PENDING_KEY_PATH


def public_of(key_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, None)
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def cert_public(cert_pem: str) -> bytes:
    return x509.load_pem_x509_certificate(cert_pem.encode()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
