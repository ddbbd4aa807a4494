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

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import validate
from .errors import ConfigError
from .specs import (
    DEFAULT_RENEW_BEFORE_HOURS,
    DEFAULT_SSH_WAIT,
    DEFAULT_VALIDITY_HOURS,
    Problems,
    collect_engines,
    collect_fabrics,
)

NODE_KEYS = {"id", "address", "port", "user", "hostKey", "servers", "mgmtAddr", "mgmtInterface",
             "fabric", "fabrics", "discovery", "engines", "failOnEngineProblems", "agent"}
TOP_KEYS = {"pkiDir", "servers", "agent", "ssh", "sshPrivateKey", "certificate", "failOnEngineProblems", "nodes"}


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
    """Every problem in the stack config at once."""

    def __init__(self, problems: list[tuple[str, str, str, str]]) -> None:
        self.problems = problems
        lines = [f"  {node}: {name}: {problem}\n    fix: {fix}" for node, name, problem, fix in problems]
        super().__init__("stack config", "llmgw:*", f"{len(problems)} problem(s):\n" + "\n".join(lines),
                         "edit stacks/Pulumi.<stack>.yaml as each fix says")


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
    for key in agent:
        if key not in ("version", "releaseUrl", "binary"):
            p.add(f"{name}.{key}", "is not an agent setting", "use version, releaseUrl or binary")
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


def parse(config: Mapping[str, Any], has_secret_key: bool = False) -> StackSpec:
    """``config``: the llmgw:* keys without their namespace, values as YAML data."""
    everyone: list[tuple[str, str, str, str]] = []
    top = Problems("llmgw")
    for key in config:
        if key not in TOP_KEYS:
            top.add(key, "is not a setting of this project", f"use one of {', '.join(sorted(TOP_KEYS))}")
    top.check("pkiDir", config.get("pkiDir"), lambda v: validate.abs_path(v, "PKI directory (holding ca.pem and ca-key.pem)"))
    servers = config.get("servers")
    if not isinstance(servers, list) or not servers:
        top.add("servers", "is empty or missing", 'list the control planes as host:port, e.g. ["cp1.example.net:7443"]')
        servers = []
    for i, s in enumerate(servers):
        top.check(f"servers[{i}]", s, validate.server)
    agent = _agent_source(config.get("agent"), "agent", top)
    ssh = _mapping(config.get("ssh"), "ssh", top)
    for key in ssh:
        if key not in ("user", "privateKeyPath", "wait", "port"):
            top.add(f"ssh.{key}", "is not an ssh setting", "use user, privateKeyPath, wait or port")
    top.check("ssh.user", ssh.get("user", "root"), validate.ssh_user)
    top.check("ssh.wait", ssh.get("wait", DEFAULT_SSH_WAIT), validate.ssh_wait)
    top.check("ssh.port", ssh.get("port", 22), validate.port)
    if not has_secret_key and not ssh.get("privateKeyPath"):
        top.add("ssh.privateKeyPath", "is missing and no llmgw:sshPrivateKey secret is set",
                "set ssh.privateKeyPath, or `pulumi config set --secret llmgw:sshPrivateKey < key`")
    cert = _mapping(config.get("certificate"), "certificate", top)
    for key in cert:
        if key not in ("validityHours", "renewBeforeHours"):
            top.add(f"certificate.{key}", "is not a certificate setting", "use validityHours or renewBeforeHours")
    validity = cert.get("validityHours", DEFAULT_VALIDITY_HOURS)
    renew = cert.get("renewBeforeHours", DEFAULT_RENEW_BEFORE_HOURS)
    top.check("certificate.validityHours", validity, validate.hours)
    top.check("certificate.renewBeforeHours", renew, validate.hours)
    if isinstance(validity, (int, float)) and isinstance(renew, (int, float)) and renew >= validity:
        top.add("certificate.renewBeforeHours", f"{renew:g} is not shorter than validityHours ({validity:g})",
                "renew some time before expiry, e.g. a tenth of the validity")
    everyone += [("llmgw", *item) for item in top]

    raw_nodes = config.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
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
        for key in raw:
            if key not in NODE_KEYS:
                p.add(key, "is not a node setting", f"use one of {', '.join(sorted(NODE_KEYS))}")
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
        fabrics = [{"name": f.get("name"), "hcas": list(f.get("hcas") or [])}
                   for f in (fabrics_raw if isinstance(fabrics_raw, list) else []) if isinstance(f, Mapping)]
        discovery = _mapping(raw.get("discovery"), "discovery", p)
        disc_out: dict[str, str] = {}
        for key, val in discovery.items():
            snake = {"nvidiaSmi": "nvidia_smi", "ibRoot": "ib_root"}.get(key)
            if snake is None:
                p.add(f"discovery.{key}", "is not a discovery setting", "use nvidiaSmi or ibRoot")
                continue
            p.check(f"discovery.{key}", val, lambda v: validate.abs_path(v, key))
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
                host_key=raw.get("hostKey"),
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
