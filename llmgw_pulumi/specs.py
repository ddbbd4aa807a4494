"""Typed inputs of the four resources, parsed from the plain dicts Pulumi hands providers.

Pulumi delivers inputs as JSON-like dicts: numbers arrive as floats, absent or
``None`` values arrive as missing keys, and during preview any value may be an
``Unknown``. This module is the one place that turns such a dict into a frozen,
typed spec, or into a list of problems that name the field and the fix.

Collecting problems never fails on an unknown value: a value that is not known
yet is checked when it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from pulumi.output import Unknown

from . import validate
from .errors import ConfigError

ENGINE_KEYS: dict[str, str] = {"llamacpp": "bin", "vllm": "bin", "sglang": "python"}
"""Each engine the agent knows, and the key under which its executable is configured (SPEC step 6)."""

DEFAULT_SSH_WAIT = 120.0
DEFAULT_VALIDITY_HOURS = 24.0 * 365
DEFAULT_RENEW_BEFORE_HOURS = 24.0 * 30
DEFAULT_IB_ROOT = "/sys/class/infiniband"


def is_unknown(value: object) -> bool:
    """True for a value (or a container holding a value) that Pulumi does not know yet."""
    if isinstance(value, Unknown):
        return True
    if isinstance(value, Mapping):
        return any(is_unknown(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_unknown(v) for v in value)
    return False


@dataclass
class Problems:
    """Collects (field, problem, fix) triples for one node; unknown values are skipped."""

    node: str
    items: list[tuple[str, str, str]] = field(default_factory=list)

    def check(self, name: str, value: object, validator: Callable[[Any], validate.Problem]) -> None:
        if is_unknown(value):
            return
        bad = validator(value)
        if bad:
            self.items.append((name, *bad))

    def add(self, name: str, problem: str, fix: str) -> None:
        self.items.append((name, problem, fix))

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        return iter(self.items)

    def raise_first(self) -> None:
        if self.items:
            name, problem, fix = self.items[0]
            raise ConfigError(self.node, name, problem, fix)


def _opt_str(props: Mapping[str, Any], key: str) -> str | None:
    value = props.get(key)
    return value if isinstance(value, str) and value else None


# --------------------------------------------------------------------------- connection


@dataclass(frozen=True)
class Connection:
    """How to reach a node over SSH. ``private_key`` is secret; it is never shown in repr."""

    host: str
    user: str
    private_key: str | None = field(repr=False)
    """The key itself (a secret in state), or None when it is read from ``private_key_path``."""
    port: int = 22
    host_key: str | None = None
    """Pinned host key as 'TYPE BASE64' (a .pub file's comment dropped). When absent the first key seen is trusted and recorded."""
    wait: float = DEFAULT_SSH_WAIT
    """Seconds to keep retrying while the node refuses SSH (cloud-init restarts sshd)."""
    private_key_path: str | None = None
    """Where the key is on the machine running Pulumi: then the key never enters state at all."""

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")

    @staticmethod
    def collect(props: object, problems: Problems, prefix: str = "connection") -> None:
        if is_unknown(props) and not isinstance(props, Mapping):
            return
        if not isinstance(props, Mapping):
            problems.add(prefix, "is missing", "give the node's SSH connection: host, user and private key")
            return
        problems.check(f"{prefix}.host", props.get("host"), validate.address)
        problems.check(f"{prefix}.user", props.get("user", "root"), validate.ssh_user)
        problems.check(f"{prefix}.port", props.get("port", 22), validate.port)
        problems.check(f"{prefix}.wait", props.get("wait", DEFAULT_SSH_WAIT), validate.ssh_wait)
        if props.get("host_key") is not None:
            problems.check(f"{prefix}.host_key", props.get("host_key"), validate.host_key)
        key = props.get("private_key")
        # Absent is allowed here: a reviewer previews without the operator's key;
        # the first operation that needs it says it is missing. Never echo the value.
        if key is not None and not is_unknown(key) and (not isinstance(key, str) or "PRIVATE KEY" not in key):
            problems.add(f"{prefix}.private_key", "is not a private key in PEM/OpenSSH format",
                         "give the SSH private key's contents (as a secret), or its path as private_key_path")
        if props.get("private_key_path") is not None:
            problems.check(f"{prefix}.private_key_path", props.get("private_key_path"),
                           lambda v: validate.abs_path(v, "path of the SSH private key"))

    @classmethod
    def from_props(cls, props: Mapping[str, Any], node: str) -> "Connection":
        problems = Problems(node)
        cls.collect(props, problems)
        problems.raise_first()
        return cls(
            host=props["host"],
            user=props.get("user", "root"),
            private_key=props.get("private_key"),
            port=int(props.get("port", 22)),
            host_key=validate.normalise_host_key(props["host_key"]) if props.get("host_key") else None,
            wait=float(props.get("wait", DEFAULT_SSH_WAIT)),
            private_key_path=props.get("private_key_path"),
        )


# --------------------------------------------------------------------------- certificate


@dataclass(frozen=True)
class CertificateSpec:
    node_id: str
    pki_dir: str
    validity_hours: float = DEFAULT_VALIDITY_HOURS
    renew_before_hours: float = DEFAULT_RENEW_BEFORE_HOURS

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        problems.check("pki_dir", props.get("pki_dir"), lambda v: validate.abs_path(v, "PKI directory"))
        problems.check("validity_hours", props.get("validity_hours", DEFAULT_VALIDITY_HOURS), validate.hours)
        problems.check("renew_before_hours", props.get("renew_before_hours", DEFAULT_RENEW_BEFORE_HOURS), validate.hours)
        v, r = props.get("validity_hours", DEFAULT_VALIDITY_HOURS), props.get("renew_before_hours", DEFAULT_RENEW_BEFORE_HOURS)
        if isinstance(v, (int, float)) and isinstance(r, (int, float)) and r >= v:
            problems.add("renew_before_hours", f"{r:g} is not shorter than the validity ({v:g} h)",
                         "renew some time before expiry, e.g. a tenth of the validity")

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "CertificateSpec":
        problems = Problems(str(props.get("node_id", "?")))
        cls.collect(props, problems)
        problems.raise_first()
        return cls(
            node_id=props["node_id"],
            pki_dir=props["pki_dir"],
            validity_hours=float(props.get("validity_hours", DEFAULT_VALIDITY_HOURS)),
            renew_before_hours=float(props.get("renew_before_hours", DEFAULT_RENEW_BEFORE_HOURS)),
        )


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class IdentitySpec:
    node_id: str
    connection: Connection
    ca_pem: str
    cert_pem: str
    key_pem: str = field(repr=False)

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        Connection.collect(props.get("connection"), problems)
        for name, marker in (("ca_pem", "BEGIN CERTIFICATE"), ("cert_pem", "BEGIN CERTIFICATE"), ("key_pem", "PRIVATE KEY-----")):
            value = props.get(name)
            if not is_unknown(value) and not (isinstance(value, str) and marker in value):
                # Never echo the value: key_pem is secret.
                problems.add(name, "is missing or not PEM", "pass the outputs of the node's ClientCertificate")

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "IdentitySpec":
        node = str(props.get("node_id", "?"))
        problems = Problems(node)
        cls.collect(props, problems)
        problems.raise_first()
        return cls(
            node_id=props["node_id"],
            connection=Connection.from_props(props["connection"], node),
            ca_pem=props["ca_pem"],
            cert_pem=props["cert_pem"],
            key_pem=props["key_pem"],
        )


# --------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class Fabric:
    name: str
    hcas: tuple[str, ...]


@dataclass(frozen=True)
class AgentSettings:
    """What agent.yaml says beyond the TLS paths: only overrides the operator gave (SPEC step 6)."""

    servers: tuple[str, ...]
    node_id: str
    mgmt_addr: str | None = None
    mgmt_interface: str | None = None
    fabrics: tuple[Fabric, ...] = ()
    nvidia_smi: str | None = None
    ib_root: str | None = None
    engines: tuple[tuple[str, str], ...] = ()
    """(engine, executable path) pairs in ENGINE_KEYS order."""

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        servers = props.get("servers")
        if not is_unknown(servers):
            if not isinstance(servers, (list, tuple)) or not servers:
                problems.add("servers", "is empty", "list at least one control plane as host:port")
            else:
                for i, s in enumerate(servers):
                    problems.check(f"servers[{i}]", s, validate.server)
                known = [s for s in servers if isinstance(s, str)]
                if len(set(known)) != len(known):
                    problems.add("servers", "lists a control plane twice", "list each control plane once, in failover order")
        if props.get("mgmt_addr") is not None:
            problems.check("mgmt_addr", props.get("mgmt_addr"), validate.address)
        if props.get("mgmt_interface") is not None:
            problems.check("mgmt_interface", props.get("mgmt_interface"), validate.interface)
        collect_fabrics(props.get("fabrics"), problems)
        discovery = props.get("discovery") or {}
        if not is_unknown(discovery):
            if not isinstance(discovery, Mapping):
                problems.add("discovery", "is not a mapping", "write discovery as {nvidia_smi: PATH, ib_root: DIR}")
            else:
                for key in discovery:
                    if key not in ("nvidia_smi", "ib_root"):
                        problems.add(f"discovery.{key}", "is not a discovery setting", "use nvidia_smi or ib_root")
                for key in ("nvidia_smi", "ib_root"):
                    if discovery.get(key) is not None:
                        problems.check(f"discovery.{key}", discovery.get(key), lambda v: validate.abs_path(v, key))
        collect_engines(props.get("engines"), problems)

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "AgentSettings":
        problems = Problems(str(props.get("node_id", "?")))
        cls.collect(props, problems)
        problems.raise_first()
        discovery = props.get("discovery") or {}
        ib_root = discovery.get("ib_root")
        return cls(
            servers=tuple(props["servers"]),
            node_id=props["node_id"],
            mgmt_addr=_opt_str(props, "mgmt_addr"),
            mgmt_interface=_opt_str(props, "mgmt_interface"),
            fabrics=tuple(Fabric(f["name"], tuple(f["hcas"])) for f in props.get("fabrics") or []),
            nvidia_smi=discovery.get("nvidia_smi") or None,
            ib_root=ib_root if ib_root and ib_root != DEFAULT_IB_ROOT else None,
            engines=engine_paths(props.get("engines")),
        )


def collect_fabrics(fabrics: object, problems: Problems, name: str = "fabrics") -> None:
    """A list of {name, hcas}. ``name="fabric"`` reports a single fabric given without a list."""
    if fabrics is None or is_unknown(fabrics) and not isinstance(fabrics, (list, tuple)):
        return
    if not isinstance(fabrics, (list, tuple)):
        problems.add(name, "is not a list", "write fabrics as a list of {name, hcas}")
        return
    seen: set[str] = set()
    for i, fab in enumerate(fabrics):
        where = name if name == "fabric" else f"{name}[{i}]"
        if not isinstance(fab, Mapping):
            problems.add(where, "is not a {name, hcas} mapping", "write each fabric as {name: ib-east, hcas: [mlx5_0]}")
            continue
        if fab.get("name") in (None, ""):
            problems.add(f"{where}.name", "is missing: HCAs were given without a fabric",
                         "name the InfiniBand fabric these HCAs are cabled to; it cannot be discovered")
        else:
            problems.check(f"{where}.name", fab.get("name"), validate.fabric_name)
        hcas = fab.get("hcas")
        if not is_unknown(hcas):
            if not isinstance(hcas, (list, tuple)) or not hcas:
                problems.add(f"{where}.hcas", "is empty: a fabric without HCAs",
                             "list the node's HCAs on this fabric, e.g. [mlx5_0, mlx5_1]")
            else:
                for j, h in enumerate(hcas):
                    problems.check(f"{where}.hcas[{j}]", h, validate.hca)
        if isinstance(fab.get("name"), str):
            if fab["name"] in seen:
                problems.add(f"{where}.name", f"fabric {fab['name']!r} is listed twice", "list each fabric once")
            seen.add(fab["name"])


def collect_engines(engines: object, problems: Problems) -> None:
    if engines is None or is_unknown(engines) and not isinstance(engines, Mapping):
        return
    if not isinstance(engines, Mapping):
        problems.add("engines", "is not a mapping", "write engines as {llamacpp: {bin: PATH}, vllm: {bin: PATH}, sglang: {python: PATH}}")
        return
    for name, conf in engines.items():
        if name not in ENGINE_KEYS:
            problems.add(f"engines.{name}", "is not an engine the agent knows", f"use one of {', '.join(ENGINE_KEYS)}")
            continue
        key = ENGINE_KEYS[name]
        if not isinstance(conf, Mapping) or set(conf) - {key}:
            problems.add(f"engines.{name}", f"must be {{{key}: PATH}}", f"write engines.{name}.{key}: /absolute/path")
            continue
        problems.check(f"engines.{name}.{key}", conf.get(key), lambda v: validate.abs_path(v, f"{name} executable"))


def engine_paths(engines: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """(engine, path) pairs from the engines mapping, in a stable order."""
    engines = engines or {}
    return tuple((name, engines[name][key]) for name, key in ENGINE_KEYS.items() if name in engines and engines[name].get(key))


@dataclass(frozen=True)
class BinarySource:
    """Where /usr/local/bin/llmgw comes from (SPEC step 5).

    A release tag is fetched by the node itself from ``release_url`` and verified
    against the release's checksums.txt; any other version is the local binary
    at ``binary_path``, copied as is (its sha256 is an input, so a rebuilt binary
    shows up in the preview).
    """

    version: str
    release_url: str | None = None
    binary_path: str | None = None
    binary_sha256: str | None = None

    @property
    def is_release(self) -> bool:
        return bool(validate.RELEASE_TAG.match(self.version))

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        v = props.get("version")
        problems.check("version", v, validate.version)
        if is_unknown(v) or not isinstance(v, str):
            return
        if validate.RELEASE_TAG.match(v):
            problems.check("release_url", props.get("release_url"), validate.url)
        else:
            if props.get("binary_path") is None:
                problems.add("binary_path", f"version {v} is not a release, so it must be copied from a local binary",
                             "give the path of the local llmgw build, or a release tag vX.Y.Z")
            else:
                problems.check("binary_path", props.get("binary_path"), lambda p: validate.abs_path(p, "local binary path"))
            sha = props.get("binary_sha256")
            if not is_unknown(sha) and not (isinstance(sha, str) and len(sha) == 64):
                problems.add("binary_sha256", "is missing", "compute it from the local binary (the node component does)")

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "BinarySource":
        problems = Problems(str(props.get("node_id", "?")))
        cls.collect(props, problems)
        problems.raise_first()
        return cls(
            version=props["version"],
            release_url=(props.get("release_url") or "").rstrip("/") or None,
            binary_path=_opt_str(props, "binary_path"),
            binary_sha256=_opt_str(props, "binary_sha256"),
        )


@dataclass(frozen=True)
class AgentSpec:
    connection: Connection
    settings: AgentSettings
    binary: BinarySource
    hostname: str

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        Connection.collect(props.get("connection"), problems)
        AgentSettings.collect(props, problems)
        BinarySource.collect(props, problems)
        problems.check("hostname", props.get("hostname"), lambda h: None if isinstance(h, str) and h else
                       ("is missing", "pass the hostname NodeIdentity read from the node"))

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "AgentSpec":
        node = str(props.get("node_id", "?"))
        problems = Problems(node)
        cls.collect(props, problems)
        problems.raise_first()
        return cls(
            connection=Connection.from_props(props["connection"], node),
            settings=AgentSettings.from_props(props),
            binary=BinarySource.from_props(props),
            hostname=props["hostname"],
        )


# --------------------------------------------------------------------------- engine check


@dataclass(frozen=True)
class EngineCheckSpec:
    node_id: str
    connection: Connection
    engines: tuple[tuple[str, str], ...]
    fail_on_problems: bool = False

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        Connection.collect(props.get("connection"), problems)
        collect_engines(props.get("engines"), problems)

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "EngineCheckSpec":
        node = str(props.get("node_id", "?"))
        problems = Problems(node)
        cls.collect(props, problems)
        problems.raise_first()
        return cls(
            node_id=node,
            connection=Connection.from_props(props["connection"], node),
            engines=engine_paths(props.get("engines")),
            fail_on_problems=bool(props.get("fail_on_problems", False)),
        )
