"""The typed inputs of the four resources: how a node is reached, its certificate, its identity, its agent, its
engine check, and how agent updates are rolled out.

Each spec is a frozen dataclass whose fields are declared once with ``schema.setting`` (see
llmgw_pulumi.config.schema); what agent.yaml says and where the binary comes from are declared in
llmgw_pulumi.config.agent_settings. ``NODE_REPLACE_KEYS`` (every resource's replace keys) and the
defaults the providers fill in are read from these declarations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import validate
from ..health import readiness
from . import signer as signer_interface
from .agent_settings import DEFAULT_IB_ROOT as DEFAULT_IB_ROOT
from .agent_settings import ENGINE_KEYS as ENGINE_KEYS
from .agent_settings import AgentSettings as AgentSettings
from .agent_settings import BinarySource as BinarySource
from .agent_settings import Discovery as Discovery
from .agent_settings import Fabric as Fabric
from .agent_settings import collect_engines, engine_map
from .agent_settings import engines_input as engines_input
from .registration import RegistrationCheck
from .registration import collect as collect_registration
from .schema import FromProps as FromProps
from .schema import Problems as Problems
from .schema import Spelling as Spelling
from .schema import build as build
from .schema import collect_fields as collect_fields
from .schema import is_unknown as is_unknown
from .schema import names as names
from .schema import nested_settings as nested_settings
from .schema import raise_problems as raise_problems
from .schema import renamed as renamed
from .schema import replace_keys, same_as, setting
from .schema import settings_of as settings_of

DEFAULT_SSH_WAIT = 120.0
DEFAULT_VALIDITY_HOURS = 24.0 * 365
DEFAULT_RENEW_BEFORE_HOURS = 24.0 * 30

# --------------------------------------------------------------------------- connection


def _private_key(value: object, problems: Problems, where: str) -> None:
    # Absent is allowed: a reviewer previews without the operator's key; the first
    # operation that needs it says it is missing. Never echo the value.
    if not is_unknown(value) and (not isinstance(value, str) or "PRIVATE KEY" not in value):
        problems.add(where, "is not a private key in PEM/OpenSSH format",
                     "give the SSH private key's contents (as a secret), or its path as private_key_path")


@dataclass(frozen=True)
class Hop:
    """A jump host (bastion) on the way to a node: it authenticates like a node, with its own host key."""

    address: str = setting("address", validate.hop, doc="user@host or user@host:port, as `ssh -J` takes it.")
    host_key: str | None = setting("hostKey", validate.host_key, convert=validate.normalise_host_key, default=None,
                                   doc="Pinned host key; otherwise the first key seen is trusted and recorded, "
                                       "like a node's.")

    @property
    def user(self) -> str:
        return validate.split_hop(self.address)[0]

    @property
    def host(self) -> str:
        return validate.split_hop(self.address)[1]

    @property
    def port(self) -> int:
        return validate.split_hop(self.address)[2]


def hops_as_given(value: Any) -> Any:
    """Jump hosts as the stack config may give them (one 'user@host', a list of them, or of {address, hostKey})
    in the inputs' spelling: a list of {address, host_key}."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return value
    return [{"address": h} if isinstance(h, str) else renamed(Hop, h) if isinstance(h, Mapping) else h for h in value]


def _collect_jump(value: Any, problems: Problems, where: str) -> None:
    hops = hops_as_given(value) if problems.in_stack_config else value
    if is_unknown(hops) and not isinstance(hops, (list, tuple)):
        return
    if not isinstance(hops, (list, tuple)):
        problems.wrong_type(where, hops, "a list of jump hosts (user@host[:port])",
                            ["deploy@bastion.example.net"] if problems.in_stack_config
                            else [{"address": "deploy@bastion.example.net"}])
        return
    for i, h in enumerate(hops):
        if not isinstance(h, Mapping):
            problems.wrong_type(f"{where}[{i}]", h, "a jump host (user@host[:port])",
                                "deploy@bastion.example.net" if problems.in_stack_config
                                else {"address": "deploy@bastion.example.net"})
            continue
        collect_fields(Hop, h, problems, prefix=f"{where}[{i}].", spelling=Spelling.INPUTS)  # named as inputs


def _any_secret(value: object, problems: Problems, where: str) -> None:
    if not is_unknown(value) and not isinstance(value, str):  # never echo the value
        problems.add(where, "is not text", "set it as a secret string")


@dataclass(frozen=True)
class Connection:
    """How to reach a node over SSH.

    ``ConnectionArgs``. ``private_key`` is secret; it is never shown in repr.

    Given to a resource or to Node, any value may be a pulumi Output.
    """

    host: str = setting("address", validate.address, replaces=True,
                        doc="The node's IP address or DNS name. Another address is another machine: replaced.")
    user: str = setting("user", validate.ssh_user, default="root", doc="The login user (not root: sudo -n).")
    private_key: str | None = setting(None, collect=_private_key, secret=True, default=None, repr=False,
                                      doc="The SSH key itself (a secret in state), or None when it is read from "
                                          "private_key_path or the ssh-agent.")
    port: int = setting("port", validate.port, convert=int, default=22, replaces=True, doc="The SSH port.")
    host_key: str | None = setting("hostKey", validate.host_key, convert=validate.normalise_host_key, default=None,
                                   doc="Pinned host key as 'TYPE BASE64' (a .pub file's comment dropped). When "
                                       "absent the first key seen is trusted and recorded.")
    wait: float = setting("wait", validate.ssh_wait, convert=float, default=DEFAULT_SSH_WAIT,
                          doc="Seconds to keep retrying while the node refuses SSH (cloud-init restarts sshd).")
    private_key_path: str | None = setting(
        "privateKeyPath", lambda v: validate.operator_path(v, "path of the SSH private key"), default=None,
        doc="Where the key is on the machine running Pulumi, absolute or as ~/...: then the key never enters state "
            "at all. ~/ is the home directory of whoever runs Pulumi, read at each operation.")
    passphrase: str | None = setting(None, collect=_any_secret, secret=True, default=None, repr=False,
                                     doc="The passphrase of a protected key (a secret); a key in ssh-agent needs none.")
    jump: tuple[Hop, ...] = setting("jump", collect=_collect_jump, default=(),
                                    convert=lambda hops: tuple(build(Hop, h) for h in hops),
                                    doc="Jump hosts, outermost first (`ssh -J`), each {address, host_key}; each "
                                        "one's connection carries every node behind it.")

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")

    @staticmethod
    def collect(props: object, problems: Problems, prefix: str = "connection") -> None:
        if is_unknown(props) and not isinstance(props, Mapping):
            return
        if props is None:
            problems.add(prefix, "is missing", "give the node's SSH connection: host, user and private key")
            return
        if not isinstance(props, Mapping):
            problems.wrong_type(prefix, props, "a connection (ConnectionArgs: host, user, private key...)",
                                {"host": "10.0.0.11", "user": "deploy"})
            return
        collect_fields(Connection, props, problems, prefix=f"{prefix}.")

    @classmethod
    def from_props(cls, props: Mapping[str, Any], node: str) -> Connection:
        raise_problems(cls.collect, props, node)
        return build(cls, props)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- certificate


def check_renewal(props: Mapping[str, Any], problems: Problems, prefix: str = "") -> None:
    """The renewal window must be shorter than the validity."""
    key = names(CertificateSpec, problems.spelling)
    v = props.get(key["validity_hours"], DEFAULT_VALIDITY_HOURS)
    r = props.get(key["renew_before_hours"], DEFAULT_RENEW_BEFORE_HOURS)
    if isinstance(v, (int, float)) and isinstance(r, (int, float)) and r >= v:
        problems.add(prefix + key["renew_before_hours"], f"{r:g} is not shorter than the validity ({v:g} h)",
                     "renew some time before expiry, e.g. a tenth of the validity")


KEY_ORIGIN_NODE, KEY_ORIGIN_OPERATOR = "node", "operator"


def _certificate_connection(value: object, problems: Problems, where: str) -> None:
    if value is not None:
        Connection.collect(value, problems, where)


def _certificate_signer(value: object, problems: Problems, where: str) -> None:
    if not is_unknown(value):
        for name, problem, fix in signer_interface.problems(value):
            problems.add(name, problem, fix)


@dataclass(frozen=True)
class CertificateSpec(FromProps):
    """The node's client certificate: how long it is valid, when it is renewed, and where its key pair is made."""

    node_id: str = setting("id", validate.node_id, replaces=True,
                           doc="The node's id: its certificate's CN, a DNS label. Another id is another node: replaced.")
    pki_dir: str | None = setting("pkiDir", lambda v: validate.abs_path(v, "PKI directory (holding ca.pem and ca-key.pem)"),
                                  default=None,
                                  doc="The directory on this machine holding ca.pem and ca-key.pem, for the default signer "
                                      "(pkiDir); not needed with another signer.")
    validity_hours: float = setting("validityHours", validate.hours, convert=float, default=DEFAULT_VALIDITY_HOURS,
                                    doc="How long a certificate issued to the node is valid, in hours.")
    renew_before_hours: float = setting("renewBeforeHours", validate.hours, convert=float,
                                        default=DEFAULT_RENEW_BEFORE_HOURS,
                                        doc="Renew the certificate this many hours before it expires.")
    key_origin: str = setting("keyOrigin", validate.key_origin, default=KEY_ORIGIN_NODE,
                              doc="Where the node's key pair is made: on the node (node: it never leaves it) or "
                                  "here (operator: kept in state, encrypted).")
    connection: Connection | None = setting(None, collect=_certificate_connection, nested=Connection, default=None,
                                            convert=lambda c: None if c is None else build(Connection, c),
                                            doc="How to reach the node, for a key made on it (keyOrigin node); None "
                                                "with keyOrigin operator.")
    signer: Mapping[str, Any] | None = setting(None, collect=_certificate_signer, default=None,
                                               doc="How the certificate is signed (llmgw_pulumi.certificates.signer.SignerSpec as "
                                                   "inputs); None: from pki_dir.")
    ca_key_passphrase: str | None = setting(None, collect=_any_secret, secret=True, default=None, repr=False,
                                            doc="The passphrase of an encrypted ca-key.pem (a secret: stack config "
                                                "llmgw:caKeyPassphrase); None: the key is not encrypted.")

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        collect_fields(CertificateSpec, props, problems)
        check_renewal(props, problems)
        signer = props.get("signer")
        kind = signer.get("kind") if isinstance(signer, Mapping) else None
        if kind in (None, "pkiDir") and props.get("pki_dir") is None and not is_unknown(signer):
            problems.add("pki_dir", "is missing", "give the PKI directory (pkiDir) holding ca.pem and ca-key.pem, "
                         "or another signer (llmgw:signer)")
        if props.get("key_origin", KEY_ORIGIN_NODE) == KEY_ORIGIN_NODE and props.get("connection") is None:
            problems.add("connection", "is missing: the node makes its key pair (keyOrigin node), so it must be reached",
                         "pass ClientCertificateArgs.connection, or key_origin='operator' to make the key here")

    @property
    def key_on_node(self) -> bool:
        return self.key_origin == KEY_ORIGIN_NODE


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class IdentitySpec:
    node_id: str
    connection: Connection
    ca_pem: str
    cert_pem: str
    key_pem: str | None = field(repr=False)
    """The key ClientCertificate made (keyOrigin operator); None when the node made it (keyOrigin node)."""

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        Connection.collect(props.get("connection"), problems)
        problems.check("key_origin", props.get("key_origin", KEY_ORIGIN_NODE), validate.key_origin)
        pems = [("ca_pem", "BEGIN CERTIFICATE"), ("cert_pem", "BEGIN CERTIFICATE")]
        if props.get("key_origin") == KEY_ORIGIN_OPERATOR:
            pems.append(("key_pem", "PRIVATE KEY-----"))
        elif props.get("key_pem") is not None and not is_unknown(props.get("key_pem")):
            problems.add("key_pem", "is given, but the node makes its own key (keyOrigin node)",
                         "pass key_origin='operator' with the key, or no key_pem")
        for name, marker in pems:
            value = props.get(name)
            if not is_unknown(value) and not (isinstance(value, str) and marker in value):
                # Never echo the value: key_pem is secret.
                problems.add(name, "is missing or not PEM", "pass the outputs of the node's ClientCertificate")

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> IdentitySpec:
        node = raise_problems(cls.collect, props)
        return cls(
            node_id=props["node_id"],
            connection=Connection.from_props(props["connection"], node),
            ca_pem=props["ca_pem"],
            cert_pem=props["cert_pem"],
            key_pem=props["key_pem"] if props.get("key_origin") == KEY_ORIGIN_OPERATOR else None,
        )



# --------------------------------------------------------------------------- rollout


def collect_canaries(value: Any, problems: Problems, where: str) -> None:
    """A list of node ids, each once (that each is a node of the stack, the stack config checks)."""
    if is_unknown(value) and not isinstance(value, (list, tuple)):
        return
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        problems.wrong_type(where, value, "a list of node ids (the nodes to update first)", ["gpu-01"])
        return
    for i, node in enumerate(value):
        problems.check(f"{where}[{i}]", node, validate.node_id)
    if len(set(map(str, value))) != len(value):
        problems.add(where, "lists a node twice", "list each canary once")


def canaries_as_given(value: Any) -> tuple[str, ...]:
    """One node id or a list of them (validated) as a tuple."""
    return (value,) if isinstance(value, str) else tuple(value)


def _max_parallel(config: str | None) -> Any:
    """Rollout's and NodeRollout's ``max_parallel``: one declaration, a stack-config name only in Rollout."""
    return setting(config, validate.positive_int, convert=int, default=None,
                   doc="At most this many agents restart at once, across the whole stack; None: no limit.")


def _rollout_directory() -> Any:
    """Rollout's and NodeRollout's ``directory``, which the program sets (never a stack-config setting)."""
    return setting(None, lambda v: validate.abs_path(v, "rollout coordination directory"), default=None,
                   doc="The stack's coordination directory on the operator's machine (the program sets it).")


@dataclass(frozen=True)
class Rollout:
    """How updates of running agents are spread across the stack: how many restart at once, and which first.

    Stack config ``llmgw:rollout``; see llmgw_pulumi.rollout.

    ``directory`` is the stack's coordination directory on the operator's machine
    (the program sets it); it is not a stack-config setting.
    """

    max_parallel: int | None = _max_parallel("maxParallel")
    canaries: tuple[str, ...] = setting("canary", collect=collect_canaries, convert=canaries_as_given, default=(),
                                        doc="Node ids updated first; the others start only once these succeeded.")
    directory: str | None = _rollout_directory()

    def for_node(self, node_id: str) -> NodeRollout:
        """What one node's AgentInstall is given of it (see NodeRollout)."""
        return NodeRollout(max_parallel=self.max_parallel, canary=node_id in self.canaries, directory=self.directory)


@dataclass(frozen=True)
class NodeRollout:
    """One node's share of llmgw:rollout: its AgentInstall's ``rollout`` input.

    The canary list is not in it: each `pulumi up` writes it into its run's
    directory (llmgw_pulumi.rollout.start_run), where a node waiting for the
    canaries reads it. So naming another canary changes the inputs of the nodes
    that become or stop being canaries, and no other node's state.
    """

    max_parallel: int | None = _max_parallel(None)
    canary: bool = setting(None, validate.boolean, default=False, doc="This node is one of the canaries.")
    directory: str | None = _rollout_directory()


# --------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class AgentSpec:
    node_id: str
    connection: Connection
    settings: AgentSettings
    binary: BinarySource
    hostname: str
    rollout: NodeRollout | None = None
    registration: RegistrationCheck | None = None
    """llmgw:registration: what must list the node once its agent (re)started; None: not checked."""

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        Connection.collect(props.get("connection"), problems)
        AgentSettings.collect(props, problems)
        BinarySource.collect(props, problems)
        if props.get("rollout") is not None:
            nested_settings(NodeRollout, "rollout")(props["rollout"], problems, "rollout")
        if props.get("registration") is not None:
            collect_registration(props["registration"], problems, "registration")
        problems.check("hostname", props.get("hostname"), lambda h: None if isinstance(h, str) and h else
                       ("is missing", "pass the hostname NodeIdentity read from the node"))

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> AgentSpec:
        node = raise_problems(cls.collect, props)
        return cls(
            node_id=node,
            connection=Connection.from_props(props["connection"], node),
            settings=build(AgentSettings, props),
            binary=build(BinarySource, props),
            hostname=props["hostname"],
            rollout=build(NodeRollout, props["rollout"]) if props.get("rollout") else None,
            registration=build(RegistrationCheck, props["registration"]) if props.get("registration") else None,
        )


# --------------------------------------------------------------------------- declared hardware (readiness)


@dataclass(frozen=True)
class HcaPorts:
    """What every port of each HCA of the node's fabrics must be (``/sys/class/infiniband/<hca>/ports/<n>/``)."""

    state: str = setting("state", readiness.port_state, convert=lambda s: s.strip().upper(), default="ACTIVE",
                         doc="The state each port must be in: ACTIVE (the default; then also physically LinkUp), "
                             "ARMED, INIT or DOWN.")
    min_rate_gbps: float | None = setting("minRateGbps", readiness.rate_gbps, convert=float, default=None,
                                          doc="The least rate each port may have, in Gb/s (400 for NDR 4X); None: "
                                              "any rate.")


@dataclass(frozen=True)
class Hardware:
    """What the node was declared to have, checked at onboarding by the readiness verdict (llmgw_pulumi.health.readiness).

    Every setting is optional: what is not declared is not compared (the health of the GPUs and the Xid events
    in the kernel log are checked on every node with nvidia-smi). In the stack config, ``llmgw:hardware`` is the
    stack's default and a node's ``hardware`` overrides it setting by setting.
    """

    gpu_count: int | None = setting("gpuCount", readiness.gpu_count, convert=int, default=None,
                                    doc="How many GPUs nvidia-smi must list; fewer is critical, more a warning.")
    gpu_model: str | None = setting("gpuModel", readiness.gpu_model, default=None,
                                    doc="Each GPU's model exactly as nvidia-smi names it (NVIDIA H200), ignoring "
                                        "case.")
    gpu_memory_mib: int | None = setting("gpuMemoryMib", readiness.gpu_memory_mib, convert=int, default=None,
                                         doc="Each GPU's total memory in MiB as nvidia-smi reports it, within 1 %.")
    min_driver: str | None = setting("minDriver", readiness.dotted_version, default=None,
                                     doc="The oldest NVIDIA driver accepted (550.54.15, or 550).")
    min_cuda: str | None = setting("minCuda", readiness.dotted_version, default=None,
                                   doc="The oldest CUDA version the driver must support (12.4).")
    hca_ports: HcaPorts | None = setting("hcaPorts", nested=HcaPorts, default=None,
                                         doc="What every port of each HCA of the node's fabrics must be; None: the "
                                             "ports are not checked (a declared HCA must still exist).")

    def expectations(self, fabrics: Sequence[Fabric]) -> readiness.Expectations:
        """What ``readiness.verdict`` compares the node with: these settings, and each HCA of ``fabrics`` when
        ``hca_ports`` is declared."""
        ports = self.hca_ports
        hcas = () if ports is None else tuple(
            readiness.HcaExpectation(hca, ports.state, ports.min_rate_gbps or 0.0)
            for hca in dict.fromkeys(h for f in fabrics for h in f.hcas))
        return readiness.Expectations(self.gpu_count, self.gpu_model, self.gpu_memory_mib, self.min_driver,
                                      self.min_cuda, hcas)


# --------------------------------------------------------------------------- engine check


@dataclass(frozen=True)
class EngineCheckSpec:
    node_id: str
    connection: Connection
    engines: tuple[tuple[str, str], ...]
    """(engine, executable path) pairs in ENGINE_KEYS order."""
    fail_on_problems: bool = setting("failOnEngineProblems", validate.boolean, default=False,
                                     doc="Fail the deployment on an engine problem, instead of warning.")
    # What the inventory checks the node's hardware against: AgentSettings' own declarations (inputs only,
    # optional: a stack whose state predates them, or that declares none, has nothing to compare).
    fabrics: Sequence[Fabric] = same_as(AgentSettings, "fabrics", config=None)
    discovery: Discovery = same_as(AgentSettings, "discovery", config=None)
    # The readiness verdict's settings: absent from the inputs unless given, so a stack made before them has
    # the same inputs as before (an upgrade changes no node).
    hardware: Hardware | None = setting("hardware", nested=Hardware, default=None,
                                        doc="The node's declared hardware (GPU count, model and memory, minimum "
                                            "driver and CUDA, HCA ports), checked by the readiness verdict.")
    fail_on_critical_problems: bool | None = setting(
        "failOnProblems", validate.boolean, default=None,
        doc="Fail the node's EngineCheck when it is not ready (a critical problem of its GPUs, fabric, driver "
            "or engines), instead of warning; warnings never fail it.")

    @property
    def expectations(self) -> readiness.Expectations:
        return (self.hardware or Hardware()).expectations(self.fabrics)

    @property
    def nvidia_smi(self) -> str | None:
        return self.discovery.nvidia_smi

    @property
    def ib_root(self) -> str:
        return self.discovery.ib_root or DEFAULT_IB_ROOT

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        Connection.collect(props.get("connection"), problems)
        if props.get("engines") is not None:
            collect_engines(props.get("engines"), problems)
        collect_fields(EngineCheckSpec, props, problems)

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> EngineCheckSpec:
        node = raise_problems(cls.collect, props)
        spec: EngineCheckSpec = build(cls, props, node_id=node, connection=Connection.from_props(props["connection"], node),
                                      engines=tuple(engine_map(props.get("engines") or {}).items()))
        return spec


NODE_REPLACE_KEYS: tuple[str, ...] = replace_keys(CertificateSpec)
"""The inputs whose change replaces each of a node's four resources: its id and its connection's address and port
(``replaces=True`` in their declarations): another machine, not the same one changed."""


def __getattr__(name: str) -> Any:
    # ``to_inputs`` makes the SDK's Outputs: it moved to llmgw_pulumi.boundary, and is still importable from here.
    if name == "to_inputs":
        from ..boundary import to_inputs

        return to_inputs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
