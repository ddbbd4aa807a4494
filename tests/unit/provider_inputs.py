"""What the engine hands the providers, without a node: inputs shaped as it sends them (numbers as floats), the
outputs of a resource that just installed them, and check() that must pass."""

from __future__ import annotations

from typing import Any

from llmgw_pulumi.nodestate.observed import STATE_VERSION, Observed, Seen
from llmgw_pulumi.providers.agent import wanted as agent_wanted
from tests.unit import fake_pem

KEY = fake_pem("OPENSSH PRIVATE KEY", "SSHKEYBODY")
CONN = {"host": "10.0.0.11", "user": "deploy", "port": 22.0, "wait": 120.0, "private_key": KEY}
PEMS = {"ca_pem": "-----BEGIN CERTIFICATE-----\nCA\n", "cert_pem": "-----BEGIN CERTIFICATE-----\nC\n",
        "key_pem": fake_pem("PRIVATE KEY", "NODEKEYBODY")}
AGENT = {"node_id": "gpu-01", "connection": CONN, "known_host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA",
         "hostname": "gpu-01", "servers": ["cp1:7443"], "version": "v1.2.3", "release_url": "https://r.example/llmgw"}


def checked(provider: Any, news: dict[str, Any], olds: dict[str, Any] | None = None) -> dict[str, Any]:
    res = provider.check(olds or {}, news)
    assert res.failures == [], res.failures
    return res.inputs


def as_seen(want):
    """The record of a node that holds exactly what ``want`` says (any bytes: "f" * 64)."""
    return Observed({p: Seen("f" * 64 if w.sha256 == "*" else w.sha256, w.mode, w.owner) for p, w in want.files.items()},
                    want.unit).record()


def as_installed(inputs):
    """AgentInstall's outputs right after it installed ``inputs``: the node seen holding what they say."""
    return {**inputs, "observed": as_seen(agent_wanted(inputs)), "state_version": STATE_VERSION}
