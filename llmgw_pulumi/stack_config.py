"""Stack config (stacks/Pulumi.<stack>.yaml) -> typed node specs, with errors that name the node and field.

Pure: takes the config values as plain data and returns a ``StackSpec`` or
raises ``ConfigError`` listing every problem found, so an operator fixes the
file in one pass. Reading secrets and local files happens in program.py.

    config:
      llmgw:pkiDir: /srv/llmgw/pki                 # holds ca.pem + ca-key.pem
      llmgw:servers: ["cp1.example.net:7443"]      # one, or several in failover order
      llmgw:agent: {version: v1.4.2, releaseUrl: https://releases.example.net/llmgw}
      #            or {binary: /home/me/llmgw/bin/llmgw}  (a dev build is copied)
      llmgw:ssh: {user: deploy, privateKeyPath: ~/.ssh/id_ed25519, wait: 120}
      llmgw:certificate: {validityHours: 8760, renewBeforeHours: 720}
      llmgw:failOnEngineProblems: false
      llmgw:nodes:
        - id: gpu-01
          address: 10.0.0.11
          fabric: {name: ib-east, hcas: [mlx5_0, mlx5_1]}
          engines: {llamacpp: {bin: /opt/llama/bin/llama-server}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from . import validate
from .errors import ConfigError, LlmgwError
from .specs import (
    DEFAULT_RENEW_BEFORE_HOURS,
    DEFAULT_SSH_WAIT,
    DEFAULT_VALIDITY_HOURS,
    ENGINE_KEYS,
    Problems,
    collect_engines,
    collect_fabrics,
)

Schema = Mapping[str, "Schema | list[Schema] | None"]
"""A setting's sub-settings: None for a value, a mapping for nested settings, [mapping] for a list of them."""

AGENT_SCHEMA: Schema = {"version": None, "releaseUrl": None, "binary": None}
SSH_SCHEMA: Schema = {"user": None, "privateKeyPath": None, "wait": None, "port": None}
CERTIFICATE_SCHEMA: Schema = {"validityHours": None, "renewBeforeHours": None}
FABRIC_SCHEMA: Schema = {"name": None, "hcas": None}
DISCOVERY_KEYS = {"nvidiaSmi": "nvidia_smi", "ibRoot": "ib_root"}
"""Stack-config discovery keys -> AgentInstall's discovery keys."""
NODE_SCHEMA: Schema = {
    "id": None, "address": None, "port": None, "user": None, "hostKey": None, "servers": None,
    "mgmtAddr": None, "mgmtInterface": None, "fabric": FABRIC_SCHEMA, "fabrics": [FABRIC_SCHEMA],
    "discovery": dict.fromkeys(DISCOVERY_KEYS), "failOnEngineProblems": None, "agent": AGENT_SCHEMA,
    "engines": {engine: {key: None} for engine, key in ENGINE_KEYS.items()},
}
SCHEMA: Schema = {
    "pkiDir": None, "servers": None, "agent": AGENT_SCHEMA,
    "ssh": SSH_SCHEMA, "sshPrivateKey": None, "certificate": CERTIFICATE_SCHEMA,
    "failOnEngineProblems": None, "nodes": [NODE_SCHEMA],
}
"""Every setting of the llmgw namespace; anything else in a stack's config is refused by name."""
SECRET_KEY = "sshPrivateKey"
"""The one setting read as a secret (`pulumi config set --secret llmgw:sshPrivateKey < key`)."""
TOP_KEYS = set(SCHEMA)
NODE_KEYS = set(NODE_SCHEMA)


def key_paths(schema: Schema = SCHEMA, prefix: str = "") -> set[str]:
    """Every setting as a dotted path ('ssh.wait', 'nodes.hostKey', 'nodes.engines.vllm.bin')."""
    paths: set[str] = set()
    for key, sub in schema.items():
        path = prefix + key
        paths.add(path)
        if isinstance(sub, list):
            sub = sub[0]
        if sub is not None:
            paths |= key_paths(sub, path + ".")
    return paths


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    address: str
    port: int
    user: str
    host_key: str | None
    servers: tuple[str, ...]
    mgmt_addr: str | None = None
    mgmt_interface: str | None = None
    fabrics: tuple[dict[str, Any], ...] = ()
    discovery: dict[str, str] = field(default_factory=dict)
    engines: dict[str, dict[str, str]] = field(default_factory=dict)
    fail_on_engine_problems: bool = False
    agent: "AgentSource | None" = None
    """This node's own agent source (e.g. a canary on a newer release); None: the stack's."""


@dataclass(frozen=True)
class AgentSource:
    version: str | None
    release_url: str | None
    binary: str | None


@dataclass(frozen=True)
class StackSpec:
    pki_dir: str
    agent: AgentSource
    ssh_private_key_path: str | None
    ssh_wait: float
    validity_hours: float
    renew_before_hours: float
    nodes: tuple[NodeConfig, ...]


class StackConfigError(ConfigError):
    """Every problem in the stack config at once, printed as a list (a pulumi.RunError: no traceback)."""

    def __init__(self, problems: list[tuple[str, str, str, str]]) -> None:
        self.problems = problems
        self.field = "llmgw:*"
        LlmgwError.__init__(self, "", problems_text(problems), "")


def problems_text(problems: list[tuple[str, str, str, str]]) -> str:
    """'stack config has N problems:' and one entry per (node, field, problem, fix), with its fix below."""
    head = f"stack config has {len(problems)} problem{'s' if len(problems) != 1 else ''}:"
    return "\n".join([head, *(f"  {node}: {name}: {problem}\n    fix: {fix}" for node, name, problem, fix in problems)])


def _unknown_keys(given: Mapping[str, Any], valid: Collection[str], where: str, what: str, p: Problems) -> None:
    """A problem for each key of ``given`` that is not one of ``valid``, with the nearest valid one."""
    for key in given:
        if key not in valid:
            p.add(f"{where}.{key}" if where else str(key), f"is not {what}", validate.did_you_mean(str(key), valid))


def _mapping(value: Any, name: str, p: Problems) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        p.add(name, "is not a mapping", f"write {name} as key: value pairs")
        return {}
    return value


def _agent_source(value: Any, name: str, p: Problems, fallback: AgentSource | None = None) -> AgentSource:
    """{version, releaseUrl} for a release, or {binary} for a local build (whose --version decides)."""
    agent = _mapping(value, name, p)
    _unknown_keys(agent, AGENT_SCHEMA, name, "an agent setting", p)
    version, binary = agent.get("version"), agent.get("binary")
    release_url = agent.get("releaseUrl", fallback.release_url if fallback else None)
    if version is None and binary is None:
        p.add(name, "names neither a version nor a local binary",
              f"give {name}.version (a release tag vX.Y.Z, with releaseUrl) or {name}.binary (a local build)")
    if version is not None:
        p.check(f"{name}.version", version, validate.version)
        if isinstance(version, str) and validate.RELEASE_TAG.match(version):
            p.check(f"{name}.releaseUrl", release_url, validate.url)
        elif binary is None:
            p.add(f"{name}.version", f"{version!r} is not a release tag, so there is no release to fetch",
                  f"give {name}.binary (the local build to copy), or a release tag vX.Y.Z")
    if binary is not None:
        p.check(f"{name}.binary", binary, lambda v: None if isinstance(v, str) and v else ("is empty", "give the path of the local llmgw build"))
    return AgentSource(version=version, release_url=release_url, binary=binary)


def parse(config: Mapping[str, Any], has_secret_key: bool = False, secret_keys: Collection[str] = ()) -> StackSpec:
    """``config``: the llmgw:* keys without their namespace, values as YAML data.

    ``secret_keys``: other keys the stack holds as secrets, by name only (their
    values are not read, so they cannot appear in a message).
    """
    everyone: list[tuple[str, str, str, str]] = []
    top = Problems("llmgw")
    _unknown_keys({**config, **dict.fromkeys(secret_keys)}, SCHEMA, "", "a setting of this project", top)
    # A setting held as a secret is not read: say so, rather than that it is missing.
    unread = [key for key in secret_keys if key in SCHEMA and key != SECRET_KEY]
    top.check("pkiDir", config.get("pkiDir"), lambda v: validate.abs_path(v, "PKI directory (holding ca.pem and ca-key.pem)"))
    servers = config.get("servers")
    if not isinstance(servers, list) or not servers:
        top.add("servers", "is empty or missing", 'list the control planes as host:port, e.g. ["cp1.example.net:7443"]')
        servers = []
    for i, s in enumerate(servers):
        top.check(f"servers[{i}]", s, validate.server)
    agent = _agent_source(config.get("agent"), "agent", top)
    ssh = _mapping(config.get("ssh"), "ssh", top)
    _unknown_keys(ssh, SSH_SCHEMA, "ssh", "an ssh setting", top)
    top.check("ssh.user", ssh.get("user", "root"), validate.ssh_user)
    top.check("ssh.wait", ssh.get("wait", DEFAULT_SSH_WAIT), validate.ssh_wait)
    top.check("ssh.port", ssh.get("port", 22), validate.port)
    if not has_secret_key and not ssh.get("privateKeyPath"):
        top.add("ssh.privateKeyPath", "is missing and no llmgw:sshPrivateKey secret is set",
                "set ssh.privateKeyPath, or `pulumi config set --secret llmgw:sshPrivateKey < key`")
    cert = _mapping(config.get("certificate"), "certificate", top)
    _unknown_keys(cert, CERTIFICATE_SCHEMA, "certificate", "a certificate setting", top)
    validity = cert.get("validityHours", DEFAULT_VALIDITY_HOURS)
    renew = cert.get("renewBeforeHours", DEFAULT_RENEW_BEFORE_HOURS)
    top.check("certificate.validityHours", validity, validate.hours)
    top.check("certificate.renewBeforeHours", renew, validate.hours)
    if isinstance(validity, (int, float)) and isinstance(renew, (int, float)) and renew >= validity:
        top.add("certificate.renewBeforeHours", f"{renew:g} is not shorter than validityHours ({validity:g})",
                "renew some time before expiry, e.g. a tenth of the validity")
    everyone += [("llmgw", *item) for item in top if re.split(r"[.\[]", item[0])[0] not in unread]
    everyone += [("llmgw", key, f"is set as a secret, but only {SECRET_KEY} is read as one",
                  f"set it again without --secret: `pulumi config set llmgw:{key} ...`") for key in unread]

    raw_nodes = config.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        if "nodes" not in unread:
            everyone.append(("llmgw", "nodes", "is empty or missing", "list the nodes to onboard: - {id: gpu-01, address: 10.0.0.11}"))
        raw_nodes = []
    nodes: list[NodeConfig] = []
    seen_ids: dict[str, int] = {}
    seen_addrs: dict[tuple[str, int], str] = {}
    default_port = int(ssh.get("port", 22)) if isinstance(ssh.get("port", 22), (int, float)) else 22
    for i, raw in enumerate(raw_nodes):
        # An invalid id (newlines, quotes...) would make a confusing label: use the position instead.
        good_id = isinstance(raw, Mapping) and validate.node_id(raw.get("id")) is None
        p = Problems(f"node {raw['id']}" if good_id else f"nodes[{i}]")
        if not isinstance(raw, Mapping):
            p.add("", "is not a mapping", "write each node as {id: ..., address: ...}")
            everyone += [(p.node, *item) for item in p]
            continue
        _unknown_keys(raw, NODE_SCHEMA, "", "a node setting", p)
        p.check("id", raw.get("id"), validate.node_id)
        p.check("address", raw.get("address"), validate.address)
        p.check("port", raw.get("port", default_port), validate.port)
        p.check("user", raw.get("user", ssh.get("user", "root")), validate.ssh_user)
        if raw.get("hostKey") is not None:
            p.check("hostKey", raw.get("hostKey"), validate.host_key)
        node_servers = raw.get("servers", servers)
        if "servers" in raw:
            if not isinstance(node_servers, list) or not node_servers:
                p.add("servers", "is empty", "list at least one control plane as host:port, or leave servers out")
                node_servers = []
            for j, s in enumerate(node_servers):
                p.check(f"servers[{j}]", s, validate.server)
        if raw.get("mgmtAddr") is not None:
            p.check("mgmtAddr", raw.get("mgmtAddr"), validate.address)
        if raw.get("mgmtInterface") is not None:
            p.check("mgmtInterface", raw.get("mgmtInterface"), validate.interface)
        if "fabric" in raw and "fabrics" in raw:
            p.add("fabric", "is given together with fabrics", "use fabric for one fabric, or fabrics for several")
        single = "fabric" in raw and "fabrics" not in raw
        fabrics_raw = [raw["fabric"]] if single else raw.get("fabrics")
        collect_fabrics(fabrics_raw, p, "fabric" if single else "fabrics")
        for i_fab, fab in enumerate(fabrics_raw if isinstance(fabrics_raw, list) else []):
            if isinstance(fab, Mapping):
                _unknown_keys(fab, FABRIC_SCHEMA, "fabric" if single else f"fabrics[{i_fab}]", "a fabric setting", p)
        fabrics = [{"name": f.get("name"), "hcas": list(f.get("hcas") or [])}
                   for f in (fabrics_raw if isinstance(fabrics_raw, list) else []) if isinstance(f, Mapping)]
        discovery = _mapping(raw.get("discovery"), "discovery", p)
        disc_out: dict[str, str] = {}
        _unknown_keys(discovery, DISCOVERY_KEYS, "discovery", "a discovery setting", p)
        for key, val in discovery.items():
            snake = DISCOVERY_KEYS.get(key)
            if snake is None:
                continue
            p.check(f"discovery.{key}", val, lambda v: validate.abs_path(v, key, on_node=True))
            if isinstance(val, str):
                disc_out[snake] = val
        engines = raw.get("engines")
        collect_engines(engines, p)
        node_agent = _agent_source(raw["agent"], "agent", p, fallback=agent) if "agent" in raw else None
        node_id = raw.get("id")
        if isinstance(node_id, str):
            if node_id in seen_ids:
                p.add("id", f"{node_id!r} is used by nodes[{seen_ids[node_id]}] too", "give every node its own id")
            seen_ids.setdefault(node_id, i)
        addr = raw.get("address")
        port_v = raw.get("port", default_port)
        if isinstance(addr, str) and isinstance(port_v, (int, float)):
            key = (addr, int(port_v))
            if key in seen_addrs:
                p.add("address", f"{addr} is also the address of node {seen_addrs[key]}",
                      "two nodes cannot be the same machine; fix the address")
            seen_addrs.setdefault(key, str(node_id))
        everyone += [(p.node, *item) for item in p]
        if not list(p):
            nodes.append(NodeConfig(
                node_id=node_id,
                address=addr,
                port=int(port_v),
                user=raw.get("user", ssh.get("user", "root")),
                host_key=validate.normalise_host_key(raw["hostKey"]) if raw.get("hostKey") is not None else None,
                servers=tuple(node_servers),
                mgmt_addr=raw.get("mgmtAddr"),
                mgmt_interface=raw.get("mgmtInterface"),
                fabrics=tuple(fabrics),
                discovery=disc_out,
                engines=dict(engines or {}),
                fail_on_engine_problems=bool(raw.get("failOnEngineProblems", config.get("failOnEngineProblems", False))),
                agent=node_agent,
            ))
    if everyone:
        raise StackConfigError(everyone)
    return StackSpec(
        pki_dir=config["pkiDir"],
        agent=agent,
        ssh_private_key_path=ssh.get("privateKeyPath"),
        ssh_wait=float(ssh.get("wait", DEFAULT_SSH_WAIT)),
        validity_hours=float(validity),
        renew_before_hours=float(renew),
        nodes=tuple(nodes),
    )
