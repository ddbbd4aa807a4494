"""What an onboarded node should look like: pure functions, no I/O.

``NODE_FILES`` is every file a node gets: path, mode, owner, where its bytes
come from and which resource installs it; ``UNIT`` is the state the agent's
unit must be in. The scripts' arguments, the survey and the drift comparison
are all derived from them. Paths, modes and owners come from the SPEC. agent.yaml is rendered with PyYAML
from a dict holding only the overrides the operator gave, so every value is
quoted by the YAML emitter and never by string concatenation.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

import yaml

from ..config.agent_settings import AgentSettings
from ..config.schema import agent_yaml_entries

IDENTITY_DIR = "/etc/llmgw"
CA_PATH = "/etc/llmgw/ca.pem"
CERT_PATH = "/etc/llmgw/agent.pem"
KEY_PATH = "/etc/llmgw/agent-key.pem"
PENDING_KEY_PATH = "/etc/llmgw/agent-key.pending.pem"
"""Where a node keeps the key pair it made for a certificate not yet installed (keyOrigin node): NodeIdentity
renames it over KEY_PATH together with the certificate it was signed into."""
TRUST_ANCHOR_PATH = "/usr/local/share/ca-certificates/llmgw-ca.crt"
BINARY_PATH = "/usr/local/bin/llmgw"
CONFIG_PATH = "/etc/llmgw/agent.yaml"
UNIT_NAME = "llmgw-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"

WRITER = "llmgw-pulumi"


class Content(Enum):
    """Where the bytes of a file come from."""

    CA_PEM = "the cluster CA's root certificate (ClientCertificate.ca_pem)"
    CERT_PEM = "the node's certificate (ClientCertificate.cert_pem)"
    KEY_PEM = "the node's private key: made on the node (keyOrigin node), or ClientCertificate.key_pem (operator)"
    AGENT_YAML = "agent.yaml as render_agent_yaml renders it"
    UNIT = "the unit as render_unit renders it"
    BINARY = "the llmgw binary: a release verified against its checksums.txt, or the local build"


IDENTITY = "NodeIdentity"
AGENT = "AgentInstall"
ROOT = "root:root"
"""Every file and directory is owned by root (user:group)."""


@dataclass(frozen=True)
class NodeFile:
    """A file a node gets: where, with which mode and owner, with what in it, installed by which resource."""

    name: str
    path: str
    mode: int
    content: Content
    resource: str
    owner: str = ROOT


@dataclass(frozen=True)
class Directory:
    """A directory the node gets: ours alone (removed with the identity once empty), or a system one we only make sure of."""

    path: str
    mode: int
    owner: str
    removed_when_empty: bool


NODE_FILES: tuple[NodeFile, ...] = (
    NodeFile("ca", CA_PATH, 0o644, Content.CA_PEM, IDENTITY),
    NodeFile("cert", CERT_PATH, 0o644, Content.CERT_PEM, IDENTITY),
    NodeFile("key", KEY_PATH, 0o600, Content.KEY_PEM, IDENTITY),
    NodeFile("trust_anchor", TRUST_ANCHOR_PATH, 0o644, Content.CA_PEM, IDENTITY),
    NodeFile("binary", BINARY_PATH, 0o755, Content.BINARY, AGENT),
    NodeFile("config", CONFIG_PATH, 0o644, Content.AGENT_YAML, AGENT),
    NodeFile("unit", UNIT_PATH, 0o644, Content.UNIT, AGENT),
)
"""Every file an onboarded node gets (SPEC steps 3-6 and 8), in the order they are installed."""

DIRECTORIES: tuple[Directory, ...] = (
    Directory(IDENTITY_DIR, 0o755, ROOT, removed_when_empty=True),
    Directory(posixpath.dirname(TRUST_ANCHOR_PATH), 0o755, ROOT, removed_when_empty=False),
)
"""Directories NodeIdentity makes sure of before it writes into them, root:root."""

UNIT_STATE: Mapping[str, str] = {"active": "active", "enabled": "enabled"}
"""The agent's unit: running (`systemctl is-active`), and started at boot (`systemctl is-enabled`)."""

WRITE_DIRS: tuple[str, ...] = tuple(sorted({posixpath.dirname(f.path) for f in NODE_FILES}))
"""Where the package writes (and so where leftovers of a run killed outright are swept)."""


def files_of(resource: str) -> tuple[NodeFile, ...]:
    return tuple(f for f in NODE_FILES if f.resource == resource)


def file_with(content: Content, resource: str) -> NodeFile:
    """The one file of ``resource`` whose bytes are ``content``."""
    (found,) = (f for f in files_of(resource) if f.content is content)
    return found


@dataclass(frozen=True)
class File:
    """A file the node should have, with its bytes."""

    path: str
    mode: int
    content: bytes = field(repr=False)
    owner: str = ROOT

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


def with_contents(files: Iterable[NodeFile], contents: Mapping[Content, str]) -> list[File]:
    """``files`` with their bytes, taken from ``contents`` by where each file's come from."""
    return [File(f.path, f.mode, contents[f.content].encode(), f.owner) for f in files]


def identity_files(ca_pem: str, cert_pem: str, key_pem: str | None) -> list[File]:
    """SPEC step 3 and 4: the identity in /etc/llmgw, and the CA root as a system trust anchor. Without
    ``key_pem`` the key was made on the node (keyOrigin node), and is not among the files sent to it."""
    files = [f for f in files_of(IDENTITY) if key_pem is not None or f.content is not Content.KEY_PEM]
    contents = {Content.CA_PEM: ca_pem, Content.CERT_PEM: cert_pem, Content.KEY_PEM: key_pem or ""}
    return with_contents(files, contents)


def agent_files(agent_yaml: str, unit: str) -> list[File]:
    """SPEC steps 6 and 8: agent.yaml and the unit (the binary's bytes come from a release or a local build)."""
    return with_contents([f for f in files_of(AGENT) if f.content is not Content.BINARY],
                         {Content.AGENT_YAML: agent_yaml, Content.UNIT: unit})


def agent_config(node_id: str, settings: AgentSettings, hostname: str) -> dict[str, object]:
    """The agent.yaml document as data: only what the node cannot find out for itself (SPEC step 6).

    Each setting is where its declaration says (``agent_yaml``, llmgw_pulumi.config.agent_settings), in declared
    order; the TLS paths and the node id (when the hostname is not it) follow the control planes.
    """
    options = agent_yaml_entries(settings)
    servers: dict[str, object] = {key: options.pop(key) for key in ("server", "servers") if key in options}
    doc: dict[str, object] = {**servers, "tls": {"ca": CA_PATH, "cert": CERT_PATH, "key": KEY_PATH}}
    if hostname != node_id:
        doc["node_id"] = node_id
    return {**doc, **options}


def config_first_line(node_id: str) -> str:
    """agent.yaml's first line; it also tells whose the file is (remote.remove_agent)."""
    return f"{config_owner_prefix(node_id)}{WRITER}. Only overrides are written here:"


def config_owner_prefix(node_id: str) -> str:
    """How agent.yaml's first line begins while it is ``node_id``'s: as this package writes it, and as
    onboard-node.sh wrote it ("# gpu-01, written by onboard-node.sh."), whose files an up adopts."""
    return f"# {node_id}, written by "


def agent_yaml_header(node_id: str) -> str:
    """agent.yaml's two comment lines: whose file it is, and that only overrides are written."""
    return config_first_line(node_id) + "\n# the agent finds everything else out for itself. `pulumi up` rewrites this file.\n"


def agent_yaml_settings(node_id: str, settings: AgentSettings, hostname: str) -> str:
    """agent.yaml without its two comment lines: the settings, as AgentInstall's input holds them and a preview
    shows them (the comment lines are the same for every change, and a node's state need not repeat them)."""
    return yaml.safe_dump(agent_config(node_id, settings, hostname), sort_keys=False, default_flow_style=False,
                          allow_unicode=False)


def agent_yaml_file(node_id: str, text: str) -> str:
    """agent.yaml's whole text from AgentInstall's input ``text`` (``agent_yaml_settings``): the two comment lines
    and the settings. A text that already begins with the comment lines (an input a package before this one
    recorded) is whole as it is."""
    header = agent_yaml_header(node_id)
    return text if text.startswith(header) else header + text


def agent_yaml_input(node_id: str, text: str) -> str:
    """What AgentInstall's input holds of an agent.yaml text (a node's file, shown after a refresh found it
    changed): the text without this package's comment lines; another writer's file whole."""
    return text.removeprefix(agent_yaml_header(node_id))


def render_agent_yaml(node_id: str, settings: AgentSettings, hostname: str) -> str:
    """agent.yaml as this package writes it."""
    return agent_yaml_file(node_id, agent_yaml_settings(node_id, settings, hostname))


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


def _unit_directives(text: str) -> list[str]:
    """A unit file's lines that systemd reads: no comments (# or ;), no blank lines, no surrounding blanks."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("#", ";"))]


def _yaml_data(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return _UNREADABLE


_UNREADABLE = object()


def equivalent(content: Content, have: str, want: str) -> bool:
    """Does a text file the node already has say what ``want`` says, though its bytes may differ?

    agent.yaml: the same YAML data (comments, quoting and key order aside);
    the unit: the same directives in the same order (comments and blank lines
    aside). This is how an up adopts a node onboarded by the script: its files
    say the same things in other words, and are left as they are.
    """
    if have == want:
        return True
    if content is Content.AGENT_YAML:
        data = _yaml_data(have)
        return data is not _UNREADABLE and data == _yaml_data(want)
    if content is Content.UNIT:
        return _unit_directives(have) == _unit_directives(want)
    return False


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
