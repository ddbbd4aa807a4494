"""Node: one GPU node onboarded, as a component chaining the four resources.

    ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck

Data flows along the chain, so the order is real, not declared: the identity
needs the certificate (signed for the key pair the node made, which
ClientCertificate asked it for, reaching it first); the agent needs the host key NodeIdentity recorded (it
is pinned for every later connection) and the hostname it read (agent.yaml
says node_id only when they differ); the engine check runs once the agent is
installed.

The node's VM can be another resource of the same program: take the address
from its outputs and pass it in ``opts`` as ``depends_on=[vm]`` and
``replace_with=[vm]``. A component is never replaced itself, so ``Node``
hands both options to each of its four resources: `pulumi up` onboards the
node as soon as the VM exists, and when the VM is replaced (re-imaged: same
address, new disk, new host key) the node's resources are replaced with it
and onboard the new machine, trusting its new host key, instead of
refusing it as a substituted machine. The engine honours ``replace_with``
before it asks a provider for a diff, so it works for these dynamic
resources with their own diff (``replace_on_changes`` would not). If the VM
must be gone before its replacement exists (a fixed address), give the VM
``delete_before_replace=True``: the engine then removes the node from the old
machine before it deletes the VM.

By default every node's resources run in one provider process, which serves
every call at once (see ``llmgw_pulumi.stack.shards``); give
``providers={"pulumi-python": ...}`` in ``opts`` to choose yourself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any, NamedTuple

import pulumi
from pulumi.output import Unknown

from ..boundary import pulumi_errors
from ..config.agent_settings import AgentSettings, BinarySource
from ..config.registration import RegistrationCheck
from ..config.registration import collect as collect_registration
from ..config.schema import Problems, SettingInfo, collect_fields, declared_in, describe_args
from ..config.specs import KEY_ORIGIN_NODE, CertificateSpec, Connection, EngineCheckSpec, Hardware, NodeRollout, Rollout
from ..decisions import NODE_TYPE
from ..errors import ConfigError
from ..health.readiness import readiness_of
from ..providers.agent import AgentInstall, AgentInstallArgs
from ..providers.certificate import ClientCertificate, ClientCertificateArgs
from ..providers.engines import EngineCheck, EngineCheckArgs
from ..providers.identity import NodeIdentity, NodeIdentityArgs
from ..releases.policy import OPT_OUT, unverified_warning, verification
from .call_stack import recorded_frames
from .shards import PACKAGE, provider_for

ConnectionArgs = Connection
"""How to reach the node over SSH: host, user, port, private_key (made secret) or private_key_path, host_key, wait."""


@dataclass
class NodeArgs:
    """One node's settings. Each field is declared once, where ``declared_in`` points (``node_settings`` lists
    them all, with their stack-config keys, types, defaults and docs)."""

    node_id: pulumi.Input[str] = declared_in(CertificateSpec, "node_id")
    connection: ConnectionArgs = declared_in(Connection)
    """How to reach the node over SSH (its stack config: the node's address, port, hostKey... and llmgw:ssh)."""
    pki_dir: pulumi.Input[str] | None = declared_in(CertificateSpec, "pki_dir")
    """The default signer's directory (ca.pem, ca-key.pem); None with ``signer``."""
    settings: AgentSettings = declared_in(AgentSettings)
    """What agent.yaml says: servers, and the overrides given (mgmt_addr, fabrics, discovery, engines...)."""
    binary: BinarySource = declared_in(BinarySource, config="agent", default=None)
    """Where /usr/local/bin/llmgw comes from: a release (version, release_url, and how it is verified:
    release_sha256, signing_key, release_ca, fetch) or a local build (binary_path, binary_sha256). Required; the
    fields of 0.1.0 (``version=``, ``release_url=``, ...) are still taken in its place (LEGACY_BINARY_FIELDS)."""
    validity_hours: pulumi.Input[float] | None = declared_in(CertificateSpec, "validity_hours", default=None)
    renew_before_hours: pulumi.Input[float] | None = declared_in(CertificateSpec, "renew_before_hours", default=None)
    fail_on_engine_problems: pulumi.Input[bool] | None = declared_in(EngineCheckSpec, "fail_on_problems", default=None)
    hardware: Hardware | None = declared_in(EngineCheckSpec, "hardware", default=None)
    """What the node was declared to have (GPUs, driver, CUDA, HCA ports), for the readiness verdict; None: only
    the health of what it has is checked."""
    fail_on_critical_problems: pulumi.Input[bool] | None = declared_in(EngineCheckSpec, "fail_on_critical_problems",
                                                                      default=None)
    """Fail the node's EngineCheck when the node is not ready (a critical problem), instead of warning."""
    key_origin: str | None = declared_in(CertificateSpec, "key_origin", default=None)
    """Where the node's key pair is made: ``node`` (the default: it never leaves the node) or ``operator``."""
    signer: Mapping[str, Any] | None = declared_in(CertificateSpec, "signer", default=None)
    """How certificates are signed (ClientCertificateArgs.signer; llmgw_pulumi.certificates.signer); None: from pki_dir."""
    ca_key: pulumi.Input[str] | None = field(default=None, metadata={
        "doc": "Signer caKey: the CA key PEM, a secret (never recorded in state).", "secret": True})
    rollout: Rollout | None = declared_in(Rollout, config="rollout", default=None)
    """How updates of running agents are spread over the stack (see llmgw_pulumi.rollout); None: not gated."""
    ca_key_passphrase: pulumi.Input[str] | None = declared_in(CertificateSpec, "ca_key_passphrase", default=None)
    """The passphrase of an encrypted ca-key.pem (made a secret); None: the CA key is not encrypted."""
    registration: RegistrationCheck | None = declared_in(RegistrationCheck, config="registration", default=None)
    """The command that must list the node once its agent (re)started (llmgw_pulumi.config.registration); None: no check."""
    # The binary's fields as NodeArgs took them up to 0.1.0: a program written then keeps working (CHANGELOG 0.2.0).
    version: InitVar[pulumi.Input[str] | None] = None
    release_url: InitVar[pulumi.Input[str] | None] = None
    binary_path: InitVar[pulumi.Input[str] | None] = None
    binary_sha256: InitVar[pulumi.Input[str] | None] = None
    release_sha256: InitVar[pulumi.Input[Mapping[str, str]] | None] = None
    signing_key: InitVar[pulumi.Input[str] | None] = None
    release_ca: InitVar[pulumi.Input[str] | None] = None
    fetch: InitVar[pulumi.Input[str] | None] = None

    def __post_init__(self, *legacy: Any) -> None:
        given = {name: value for name, value in zip(LEGACY_BINARY_FIELDS, legacy, strict=True) if value is not None}
        if given and self.binary is not None:
            raise TypeError(f"NodeArgs for {self.node_id!r}: give binary=BinarySource(...) or its fields "
                            f"({', '.join(given)}), not both")
        if given:
            self.binary = BinarySource(**given)
        if not isinstance(self.binary, BinarySource):
            raise TypeError(f"NodeArgs for {self.node_id!r}: binary must be a BinarySource (where /usr/local/bin/llmgw "
                            f"comes from), not {type(self.binary).__name__}: give "
                            f"binary=BinarySource(version='v1.4.2', release_url='https://...')")

    def problems(self) -> list[ConfigError]:
        """Every problem of these settings at once (``check_node_args``); nothing is registered."""
        return check_node_args(self)


LEGACY_BINARY_FIELDS = ("version", "release_url", "binary_path", "binary_sha256", "release_sha256", "signing_key",
                        "release_ca", "fetch")
"""NodeArgs' keyword arguments of 0.1.0 for what is now ``binary``, in the order of its InitVars."""


def _as_inputs(value: Any) -> Any:
    """``value`` as its resource's check sees it: dataclasses as mappings by input name, sequences as lists, None
    left out, and an Output as a value not known yet (checked by the resource, once it is known)."""
    if isinstance(value, pulumi.Output):
        return Unknown()  # type: ignore[no-untyped-call]  # the SDK does not annotate it
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is not None and f.metadata.get("to_input") and not isinstance(v, pulumi.Output):
                v = f.metadata["to_input"](v)
            if v is not None:
                out[f.name] = _as_inputs(v)
        return out
    if isinstance(value, Mapping):
        return {k: _as_inputs(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_as_inputs(v) for v in value]
    return value


def check_node_args(args: NodeArgs) -> list[ConfigError]:
    """Every problem of one node's settings, each a ConfigError naming the node, the field (as NodeArgs spells
    it: ``settings.servers``, ``connection.host_key``) and the fix: what the node's four resources would refuse,
    one resource at a time, found here at once and before anything is registered. A value that is a pulumi
    Output is checked by its resource, once it is known."""
    node = args.node_id if isinstance(args.node_id, str) and args.node_id else "node"
    found: list[tuple[str, str, str]] = []

    def check(prefix: str, collect: Callable[[Any, Problems], None], props: Any, rename: Mapping[str, str] = {}) -> None:
        problems = Problems(node)
        collect(props, problems)
        for name, problem, fix in problems:
            name = rename.get(name, prefix + name)
            if (name, problem, fix) not in found:
                found.append((name, problem, fix))

    key_origin = args.key_origin or KEY_ORIGIN_NODE
    certificate = {"node_id": args.node_id, "pki_dir": args.pki_dir, "validity_hours": args.validity_hours,
                   "renew_before_hours": args.renew_before_hours, "key_origin": key_origin,
                   "connection": args.connection if key_origin == KEY_ORIGIN_NODE else None, "signer": args.signer,
                   "ca_key_passphrase": args.ca_key_passphrase}
    check("", CertificateSpec.collect, _as_inputs(certificate))
    if key_origin != KEY_ORIGIN_NODE:  # the identity and the agent reach the node in any case
        check("", Connection.collect, _as_inputs({"connection": args.connection}).get("connection"))
    check("settings.", AgentSettings.collect, _as_inputs(args.settings) if args.settings is not None else None)
    check("binary.", BinarySource.collect, _as_inputs(args.binary))
    unverified = args.binary.unverified_release() if isinstance(args.binary, BinarySource) else None
    if unverified is not None:
        found.append((f"binary.{unverified[0]}", *unverified[1:]))
    check("", lambda props, problems: collect_fields(EngineCheckSpec, props, problems,
                                                     only=("fail_on_problems", "hardware", "fail_on_critical_problems")),
          _as_inputs({"fail_on_problems": args.fail_on_engine_problems, "hardware": args.hardware,
                      "fail_on_critical_problems": args.fail_on_critical_problems}),
          rename={"fail_on_problems": "fail_on_engine_problems"})
    if args.rollout is not None:
        check("rollout.", lambda props, problems: collect_fields(Rollout, props, problems), _as_inputs(args.rollout))
    if args.registration is not None:
        check("", lambda props, problems: collect_registration(props, problems, "registration"),
              _as_inputs(args.registration))
    return [ConfigError(node, name, problem, fix) for name, problem, fix in found]


def node_settings() -> list[SettingInfo]:
    """Every setting of one node (``NodeArgs``), depth first: path by input names, stack-config key, type,
    default, doc, whether it nests others, is secret, replaces the node's resources, and its agent.yaml key.

    The stable description a component schema for other languages is generated from (docs/operations.md,
    "The settings' schema"): entries may be added, none is renamed or removed without a note in the changelog.
    """
    return describe_args(NodeArgs)


def engine_problems(problems: list[dict[str, str]] | None) -> list[dict[str, str]]:
    """The engines' problems among EngineCheck.problems (the others are about the node's hardware)."""
    return [p for p in problems or [] if "engine" in p]


class Parts(NamedTuple):
    """The four resources of one node, in the order of the chain."""

    certificate: ClientCertificate
    identity: NodeIdentity
    agent: AgentInstall
    engine_check: EngineCheck


class Node(pulumi.ComponentResource):
    certificate: ClientCertificate
    identity: NodeIdentity
    agent: AgentInstall
    engine_check: EngineCheck
    readiness: pulumi.Output[str]
    """``ready``, ``degraded`` (warnings only) or ``not ready`` (a critical problem of its GPUs, fabric, driver or
    engines), as of the node's last probe: for a program to act on (e.g. to keep the node out of a pool)."""

    def __init__(self, name: str, args: NodeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        with recorded_frames(1):  # where the program made it (llmgw_pulumi.stack.call_stack)
            super().__init__(NODE_TYPE, name, None, opts)
        with pulumi_errors():  # a ConfigError reaches the program as a pulumi.RunError: no traceback
            self.certificate, self.identity, self.agent, self.engine_check = onboard(self, name, args, opts)
        self.readiness = node_readiness(self.engine_check)
        # The component records no outputs of its own: each value it could repeat (hostname, host key,
        # certificate, agent hash, problems, inventory) is in its resources' state already, the stack
        # outputs show them (llmgw_pulumi.stack.program), and a program reads them from the four resources'
        # attributes. Repeating them cost state for every node and ten more Outputs for
        # the SDK to wait on (it waits on every Output at the end of a run, each time one resolves).
        self.register_outputs({})


def node_readiness(check: EngineCheck) -> pulumi.Output[str]:
    """The node's readiness from its check's problems (``readiness.readiness_of``): the same verdict as the check's
    ``readiness`` output, and one for a check recorded before that output existed."""
    return check.problems.apply(readiness_of)


def onboard(parent: pulumi.ComponentResource, name: str, args: NodeArgs,
            opts: pulumi.ResourceOptions | None = None) -> Parts:
    """The node's four resources as children of ``parent`` (a Node; or the component of llmgw_pulumi.stack.component).

    They record no frame of the program's call stack: theirs would be this function's lines (llmgw_pulumi.stack.call_stack).
    """
    with recorded_frames(0):
        return _onboard(parent, name, args, opts)


def recorded_binary(node_id: pulumi.Input[str], binary: BinarySource) -> BinarySource:
    """``binary`` with how it is verified recorded (its ``verification``: releases.policy.VERIFICATIONS), as
    AgentInstall's input the release-verified policy rule reads. The program records it before the pins it
    approved replace what was configured; from a program's own NodeArgs it is worked out here. A release that
    nothing verifies (no signing key, no sha256 pin, no opt-out) is refused here, before any of the node's
    resources exists."""
    if binary.verification is not None:
        return binary
    given = (binary.binary_path, binary.signing_key, binary.release_sha256, binary.allow_unverified_release)
    if any(isinstance(v, pulumi.Output) for v in given):
        record = pulumi.Output.all(*given).apply(lambda v: verification(not v[0], v[1], v[2], v[3]))
        return dataclasses.replace(binary, verification=record)  # type: ignore[arg-type]  # an Input here
    unverified = binary.unverified_release()
    if unverified is not None:
        field, problem, fix = unverified
        raise ConfigError(node_id if isinstance(node_id, str) else "node", f"binary.{field}", problem, fix)
    return dataclasses.replace(binary, verification=binary.verified_by())


def warn_if_unverified(agent: AgentInstall, node_id: pulumi.Input[str], binary: BinarySource) -> None:
    """The warning under the node's agent when it installs a release nothing verifies (the opt-out)."""
    def warn(values: list[Any]) -> None:
        if values[0] == OPT_OUT:
            pulumi.log.warn(unverified_warning(str(values[1]), str(values[2])), resource=agent)

    given = [binary.verification, node_id, binary.version]
    if any(isinstance(v, pulumi.Output) for v in given):
        pulumi.Output.all(*given).apply(warn)
    else:
        warn(given)


def _onboard(parent: pulumi.ComponentResource, name: str, args: NodeArgs, opts: pulumi.ResourceOptions | None) -> Parts:
    binary = recorded_binary(args.node_id, args.binary)
    child = child_options(parent, name, args, opts or pulumi.ResourceOptions())
    conn = args.connection

    key_on_node = args.key_origin in (None, KEY_ORIGIN_NODE)
    certificate = ClientCertificate(name, ClientCertificateArgs(
        node_id=args.node_id, pki_dir=args.pki_dir,
        validity_hours=args.validity_hours, renew_before_hours=args.renew_before_hours,
        key_origin=args.key_origin or KEY_ORIGIN_NODE, connection=conn if key_on_node else None,
        signer=args.signer, ca_key=args.ca_key, ca_key_passphrase=args.ca_key_passphrase,
    ), child)

    # With the key made on the node, ClientCertificate reached it first: its host keys are expected.
    identity = NodeIdentity(name, NodeIdentityArgs(
        node_id=args.node_id, connection=conn,
        ca_pem=certificate.ca_pem, cert_pem=certificate.cert_pem,
        key_pem=None if key_on_node else certificate.key_pem,
        key_origin=args.key_origin or KEY_ORIGIN_NODE,
        known_host_key=certificate.host_key if key_on_node else None,
        known_jump_host_keys=certificate.jump_host_keys if key_on_node else None,
    ), child)

    # Every later connection expects the host key NodeIdentity saw (or was given).
    known_host_key = identity.host_key

    agent = AgentInstall(name, AgentInstallArgs(
        node_id=args.node_id, connection=conn, known_host_key=known_host_key,
        known_jump_host_keys=identity.jump_host_keys, hostname=identity.hostname,
        settings=args.settings, binary=binary, rollout=node_rollout(args.rollout, args.node_id),
        registration=args.registration,
    ), child)
    warn_if_unverified(agent, args.node_id, binary)

    check = EngineCheck(name, EngineCheckArgs(
        node_id=args.node_id, connection=conn, known_host_key=known_host_key,
        known_jump_host_keys=identity.jump_host_keys, engines=args.settings.engines,
        fail_on_problems=args.fail_on_engine_problems,
        fabrics=args.settings.fabrics, discovery=args.settings.discovery,
        hardware=args.hardware, fail_on_critical_problems=args.fail_on_critical_problems,
    ), pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[agent])))

    # Engine and hardware problems are warnings on this node's check, visible in `pulumi up`.
    def warn(problems: list[dict[str, str]] | None) -> None:
        for p in problems or []:
            pulumi.log.warn(f"{p['problem']}\n  hint: {p['hint']}", resource=check)

    check.problems.apply(warn)
    return Parts(certificate, identity, agent, check)


def node_rollout(policy: Rollout | None, node_id: pulumi.Input[str]) -> pulumi.Input[NodeRollout] | None:
    """The node's share of llmgw:rollout (``Rollout.for_node``), its AgentInstall's ``rollout`` input."""
    if policy is None:
        return None
    if isinstance(node_id, str):
        return policy.for_node(node_id)
    return pulumi.Output.all(node_id).apply(lambda known: policy.for_node(str(known[0])))


def child_options(parent: pulumi.ComponentResource, name: str, args: NodeArgs,
                  opts: pulumi.ResourceOptions) -> pulumi.ResourceOptions:
    """Options of the four resources: the node as parent, the node's VM dependencies, its provider process.

    ``depends_on`` and ``replace_with`` act on the resources that do the
    work, not on the component. Without a `pulumi-python` provider given
    (in opts or by a parent), the node's shard is used.
    """
    child = pulumi.ResourceOptions(parent=parent, depends_on=opts.depends_on, replace_with=opts.replace_with)
    if parent.get_provider(f"{PACKAGE}:dynamic:Resource") is None:
        child.providers = {PACKAGE: provider_for(args.node_id if isinstance(args.node_id, str) else name)}
    return child
