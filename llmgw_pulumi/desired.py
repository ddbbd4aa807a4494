"""What an onboarded node should look like: pure functions, no I/O.

Paths, modes and owners come from the SPEC. agent.yaml is rendered with PyYAML
from a dict holding only the overrides the operator gave, so every value is
quoted by the YAML emitter and never by string concatenation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import yaml

from .specs import ENGINE_KEYS, AgentSettings

IDENTITY_DIR = "/etc/llmgw"
CA_PATH = "/etc/llmgw/ca.pem"
CERT_PATH = "/etc/llmgw/agent.pem"
KEY_PATH = "/etc/llmgw/agent-key.pem"
TRUST_ANCHOR_PATH = "/usr/local/share/ca-certificates/llmgw-ca.crt"
BINARY_PATH = "/usr/local/bin/llmgw"
CONFIG_PATH = "/etc/llmgw/agent.yaml"
UNIT_NAME = "llmgw-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"

WRITER = "llmgw-pulumi"


@dataclass(frozen=True)
class File:
    """A file the node should have, owned root:root."""

    path: str
    mode: int
    content: bytes = field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


def identity_files(ca_pem: str, cert_pem: str, key_pem: str) -> list[File]:
    """SPEC step 3 and 4: the identity in /etc/llmgw, and the CA root as a system trust anchor."""
    return [
        File(CA_PATH, 0o644, ca_pem.encode()),
        File(CERT_PATH, 0o644, cert_pem.encode()),
        File(KEY_PATH, 0o600, key_pem.encode()),
        File(TRUST_ANCHOR_PATH, 0o644, ca_pem.encode()),
    ]


def agent_config(settings: AgentSettings, hostname: str) -> dict[str, object]:
    """The agent.yaml document as data: only what the node cannot find out for itself (SPEC step 6)."""
    doc: dict[str, object] = {}
    if len(settings.servers) == 1:
        doc["server"] = settings.servers[0]
    else:
        doc["servers"] = list(settings.servers)
    doc["tls"] = {"ca": CA_PATH, "cert": CERT_PATH, "key": KEY_PATH}
    if hostname != settings.node_id:
        doc["node_id"] = settings.node_id
    if settings.mgmt_addr:
        doc["mgmt_addr"] = settings.mgmt_addr
    if settings.mgmt_interface:
        doc["mgmt_interface"] = settings.mgmt_interface
    if settings.fabrics:
        doc["fabrics"] = [{"name": f.name, "hcas": list(f.hcas)} for f in settings.fabrics]
    discovery = {k: v for k, v in (("nvidia_smi", settings.nvidia_smi), ("ib_root", settings.ib_root)) if v}
    if discovery:
        doc["discovery"] = discovery
    if settings.engines:
        doc["engines"] = {name: {ENGINE_KEYS[name]: path} for name, path in settings.engines}
    return doc


def config_first_line(node_id: str) -> str:
    """agent.yaml's first line; it also tells whose the file is (remote.remove_agent)."""
    return f"# {node_id}, written by {WRITER}. Only overrides are written here:"


def render_agent_yaml(settings: AgentSettings, hostname: str) -> str:
    header = (
        config_first_line(settings.node_id) + "\n"
        "# the agent finds everything else out for itself. `pulumi up` rewrites this file.\n"
    )
    body = yaml.safe_dump(agent_config(settings, hostname), sort_keys=False, default_flow_style=False, allow_unicode=False)
    return header + body


def render_unit() -> str:
    """SPEC step 8. KillMode=process: engines outlive an agent restart and are adopted again."""
    return (
        f"# Written by {WRITER}. `pulumi up` rewrites this file.\n"
        "[Unit]\n"
        "Description=llmgw node agent\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        f"ExecStart={BINARY_PATH} agent --config {CONFIG_PATH}\n"
        "# Engines outlive a restart of the agent and are adopted by the next start:\n"
        "# never kill the whole process group.\n"
        "KillMode=process\n"
        "Restart=on-failure\n"
        "RestartSec=2s\n"
        "StateDirectory=llmgw-agent\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
