"""Stack config (stacks/Pulumi.<stack>.yaml) -> typed node specs, with errors that name the node and field.

Pure: takes the config values as plain data and returns a ``StackSpec`` or
raises ``ConfigError`` listing every problem found, so an operator fixes the
file in one pass. Reading secrets and local files happens in program.py.

    config:
      llmgw:pkiDir: /srv/llmgw/pki                 # holds ca.pem + ca-key.pem (the default signer)
      # or: llmgw:signer: {kind: command, ca: /srv/llmgw/ca.pem, command: [/usr/local/bin/llmgw-sign]}
      # or: llmgw:signer: {kind: caKey, ca: /srv/llmgw/ca.pem} and the secret llmgw:caKey
      llmgw:servers: ["cp1.example.net:7443"]      # one, or several in failover order
      llmgw:agent: {version: v1.4.2, releaseUrl: https://releases.example.net/llmgw,
                    signingKey: "ssh-ed25519 AAAAC3..."}   # or sha256: {amd64: ..., arm64: ...}; fetch: operator
      #            or {binary: /home/me/llmgw/bin/llmgw}  (a dev build is copied)
      llmgw:ssh: {user: deploy, privateKeyPath: ~/.ssh/id_ed25519, wait: 120}
      llmgw:certificate: {validityHours: 8760, renewBeforeHours: 720}   # keyOrigin: node (default) | operator
      # an encrypted ca-key.pem: `pulumi config set --secret llmgw:caKeyPassphrase`
      llmgw:failOnEngineProblems: false
      llmgw:hardware: {gpuCount: 8, gpuModel: NVIDIA H200, minDriver: "570", hcaPorts: {minRateGbps: 400}}
      llmgw:failOnProblems: true                  # a node that is not ready fails its EngineCheck
      llmgw:rollout: {maxParallel: 2, canary: [gpu-01]}   # how running agents are upgraded
      llmgw:registration: {command: [llmgw, ctl, nodes, --server, "cp1.example.net:7443"], timeoutSeconds: 30}
      llmgw:nodes:
        - id: gpu-01
          address: 10.0.0.11
          fabric: {name: ib-east, hcas: [mlx5_0, mlx5_1]}
          engines: {llamacpp: {bin: /opt/llama/bin/llama-server}}
        - id: gpu-02                              # a node without openssl: its key is made here,
          address: 10.0.0.12                      # kept in state as a secret
          keyOrigin: operator
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..errors import StackConfigError as StackConfigError  # raised by parse; its home is errors
from ..releases.policy import OPT_OUT_SETTING, pins_for
from . import registration
from . import signer as signer_interface
from .agent_settings import FABRIC_SCHEMA, AgentSettings, BinarySource, collect_fabric
from .registration import RegistrationCheck
from .schema import Problems, Schema, Spelling, build, collect_fields, collect_one, config_schema, flow_yaml, key_shown, kind_of, renamed
from .specs import CertificateSpec, Connection, EngineCheckSpec, Hardware, Rollout, check_renewal, hops_as_given


@dataclass(frozen=True)
class Part:
    """Which of a spec's settings one mapping of the stack config holds; their keys and validation are the spec's."""

    spec: type
    fields: tuple[str, ...] | None = None
    """By input name; None: every setting of the spec that has a stack-config key."""
    partial: bool = False
    """A setting it does not give falls back to the stack's (so none is required here)."""

    def collect(self, values: Mapping[str, Any], problems: Problems, prefix: str = "") -> None:
        collect_fields(self.spec, values, problems, prefix=prefix, only=self.fields, partial=self.partial)


def parts_schema(*parts: Part) -> dict[str, Any]:
    """The stack-config keys of ``parts``, with their sub-settings."""
    return {key: sub for part in parts for key, sub in config_schema(part.spec, part.fields).items()}


TOP_PARTS = (Part(AgentSettings, ("servers",)), Part(EngineCheckSpec))
"""What llmgw:* itself holds (besides the mappings below, the signer and the nodes)."""
SSH_PART = Part(Connection, ("user", "wait", "port", "jump"))
"""llmgw:ssh: how every node is reached, unless it says otherwise (and privateKeyPath, read by the program)."""
CERTIFICATE_PART = Part(CertificateSpec, ("validity_hours", "renew_before_hours", "key_origin"))
"""llmgw:certificate."""
NODE_PARTS = (Part(Connection, ("host", "port", "user", "host_key", "jump")), Part(AgentSettings, partial=True),
              Part(EngineCheckSpec, partial=True), Part(CertificateSpec, ("key_origin",), partial=True))
"""One entry of llmgw:nodes (besides its id, fabric and agent): what it does not give is the stack's."""

AGENT_SCHEMA: Schema = config_schema(BinarySource)
SSH_SCHEMA: Schema = {**parts_schema(SSH_PART), "privateKeyPath": None}
CERTIFICATE_SCHEMA: Schema = parts_schema(CERTIFICATE_PART)
ROLLOUT_SCHEMA: Schema = config_schema(Rollout)
REGISTRATION_SCHEMA: Schema = config_schema(RegistrationCheck)
NODE_SCHEMA: Schema = {"id": None, **parts_schema(*NODE_PARTS), "fabric": FABRIC_SCHEMA, "agent": AGENT_SCHEMA}
SIGNER_SCHEMA: Schema = config_schema(signer_interface.SignerSpec)
SCHEMA: Schema = {
    "pkiDir": None, "signer": SIGNER_SCHEMA, "caKey": None, "servers": None, "agent": AGENT_SCHEMA,
    "ssh": SSH_SCHEMA, "sshPrivateKey": None, "sshKeyPassphrase": None, "caKeyPassphrase": None,
    "certificate": CERTIFICATE_SCHEMA,
    **parts_schema(*TOP_PARTS), "rollout": ROLLOUT_SCHEMA, "registration": REGISTRATION_SCHEMA, "nodes": [NODE_SCHEMA],
    "inventory": None,
}
"""Every setting of the llmgw namespace; anything else in a stack's config is refused by name."""
SECRET_KEY = "sshPrivateKey"
"""The SSH key, read as a secret (`pulumi config set --secret llmgw:sshPrivateKey < key`)."""
PASSPHRASE_KEY = "sshKeyPassphrase"
"""The passphrase of a protected SSH key, read as a secret (`pulumi config set --secret llmgw:sshKeyPassphrase`)."""
CA_PASSPHRASE_KEY = "caKeyPassphrase"
"""The passphrase of an encrypted ca-key.pem, read as a secret (`pulumi config set --secret llmgw:caKeyPassphrase`)."""
CA_KEY = "caKey"
"""The CA key of signer caKey, read as a secret (`pulumi config set --secret llmgw:caKey < ca-key.pem`)."""
SECRET_KEYS = (SECRET_KEY, PASSPHRASE_KEY, CA_PASSPHRASE_KEY, CA_KEY)
"""The settings read as secrets; any other setting held as a secret is refused, unread."""
NODES_KEY = "nodes"
"""The nodes to onboard: a list of mappings, each a node's settings (what a node does not give is the stack's)."""
INVENTORY_KEY = "inventory"
"""A node list file (YAML or CSV; a path relative to the project directory) that holds the nodes instead of
llmgw:nodes: each row a node's settings."""
NAMESPACE = "llmgw"
"""The stack config's namespace: ``llmgw:servers``."""
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
    connection: Connection
    """How to reach the node, without the SSH key: the program adds it."""
    settings: AgentSettings
    fail_on_engine_problems: bool = False
    agent: BinarySource | None = None
    """This node's own binary source (e.g. a canary on a newer release); None: the stack's."""
    key_origin: str = CertificateSpec.key_origin
    """Where the node's key pair is made (``keyOrigin``): on the node, or on the operator's machine."""
    hardware: Hardware | None = None
    """What the node was declared to have (``hardware``: the stack's llmgw:hardware, overridden setting by
    setting by the node's own); None when neither declares any."""
    fail_on_critical_problems: bool | None = None
    """``failOnProblems``, the node's or the stack's; None when neither gives it (off)."""


@dataclass(frozen=True)
class SignerConfig:
    """llmgw:signer, as given (``ca`` a path on this machine or PEM text: the program reads a path)."""

    kind: str
    ca: str | None = None
    command: tuple[str, ...] = ()
    timeout_seconds: float | None = None
    max_parallel: int | None = None


@dataclass(frozen=True)
class StackSpec:
    pki_dir: str | None
    agent: BinarySource
    ssh_private_key_path: str | None
    validity_hours: float
    renew_before_hours: float
    nodes: tuple[NodeConfig, ...]
    rollout: Rollout | None = None
    """llmgw:rollout, when given (without its directory: the program adds it)."""
    signer: SignerConfig | None = None
    """llmgw:signer; None: pkiDir, the default."""
    registration: RegistrationCheck | None = None
    """llmgw:registration: the command that must list each node once its agent started; None: not checked."""


def _unknown_keys(given: Mapping[str, Any], valid: Collection[str], where: str, what: str, p: Problems) -> None:
    """A problem for each key of ``given`` that is not one of ``valid``, with the nearest valid one."""
    for key in given:
        if key not in valid:
            shown = key_shown(key)
            p.add(f"{where}.{shown}" if where else shown, f"is not {what}", validate.did_you_mean(str(key), valid))


MAPPING_EXAMPLES: dict[str, Any] = {
    "agent": {"version": "v1.4.2", "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "~/.ssh/id_ed25519"},
    "certificate": {"validityHours": 8760},
    "rollout": {"maxParallel": 2},
    "signer": {"kind": "command", "ca": "/srv/llmgw/ca.pem", "command": ["/usr/local/bin/llmgw-sign"]},
    "registration": {"command": registration.EXAMPLE_COMMAND},
}
"""How each mapping of the stack config is written, for the fix of one given as something else."""
NODE_EXAMPLE = {"id": "gpu-01", "address": "10.0.0.11"}


def _mapping(value: Any, name: str, p: Problems) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        p.wrong_type(name, value, f"a mapping of {name} settings", MAPPING_EXAMPLES[name.rpartition(".")[2]])
        return {}
    return value


def _agent_source(value: Any, name: str, p: Problems, fallback: BinarySource | None = None,
                  stack_pins: Any = None) -> BinarySource:
    """{version, releaseUrl, ...} for a release, or {binary} for a local build (whose --version decides).

    A node's own agent settings fall back to the stack's: releaseUrl, signingKey, releaseCa, fetch and
    allowUnverifiedRelease always; the version when the node gives neither a version nor a binary. A release's
    sha256 pins are those its own mapping gives for its version, else the stack's agent.sha256 for that version
    (``stack_pins``, as configured: per version, or for the stack's version).
    """
    agent = _mapping(value, name, p)
    _unknown_keys(agent, AGENT_SCHEMA, name, "an agent setting", p)
    inherited: dict[str, Any] = {}
    if fallback is not None:
        inherited = {"releaseUrl": fallback.release_url, "signingKey": fallback.signing_key,
                     "releaseCa": fallback.release_ca, "fetch": fallback.fetch,
                     OPT_OUT_SETTING: fallback.allow_unverified_release}
        if "version" not in agent and "binary" not in agent:
            inherited.update(version=fallback.version or None, binary=fallback.binary_path)
    given = {**{k: v for k, v in inherited.items() if v is not None}, **agent}
    before = len(p.items)
    BinarySource.collect(given, p, prefix=f"{name}.")
    binary = given.get("binary")
    if binary is not None:
        # A path on this machine, made absolute by the program: `~/src/llmgw/llmgw` is fine.
        p.check(f"{name}.binary", binary, lambda v: validate.local_path(v, "path of the local llmgw build"))
    version = given.get("version")
    given.pop("sha256", None)
    if binary is None and isinstance(version, str) and validate.RELEASE_TAG.match(version) and len(p.items) == before:
        pins = pins_for(agent.get("sha256"), version, version)
        if pins is None and fallback is not None:
            pins = pins_for(stack_pins, version, fallback.version)
        if pins is not None:
            given["sha256"] = pins
    # As given: the program reads a local build's version, expands ~ and approves the digests.
    return BinarySource(**{"version": "", **renamed(BinarySource, given)})


def _unverified(node_agent: BinarySource, own: bool, p: Problems) -> None:
    """A node whose release nothing verifies (no signing key, no pin for its version, no opt-out): one problem
    naming the node, agent.signingKey and the commands that fix it, before anything happens."""
    if not node_agent.is_release or node_agent.verified_by() is not None:
        return
    tag = node_agent.version
    pin = f"llmgw:agent.sha256[\"{tag}\"].amd64"
    fixes = ["`pulumi config set --path llmgw:agent.signingKey 'ssh-ed25519 AAAA...'` (the release signing key's "
             "public line)", f"pin it for every node on {tag}: `pulumi config set --path {shlex.quote(pin)} SHA256` "
             "(one per architecture)"]
    if p.config_key is None:  # a node list file
        fixes.append("or give this node agent.signingKey, or agent.sha256.<arch> for its version, in the file")
        opt_out = f"or, knowingly, agent.{OPT_OUT_SETTING}: true in the file (or for the stack: " \
                  f"`pulumi config set --path llmgw:agent.{OPT_OUT_SETTING} true`)"
    else:
        key = f"{p.config_key}agent.{OPT_OUT_SETTING}" if own else f"llmgw:agent.{OPT_OUT_SETTING}"
        opt_out = f"or, knowingly, `pulumi config set --path {shlex.quote(key)} true`"
    p.add("agent.signingKey", f"is missing, and no agent.sha256 pin verifies release {tag}, which this node installs",
          "; ".join(fixes) + "; " + opt_out + " (a warning under the node)")


def _check_node(raw: Mapping[str, Any], p: Problems, stack_agent: BinarySource,
                stack_pins: Any = None) -> BinarySource | None:
    """Validate one node's settings by the specs' own fields; returns its own agent source, if any."""
    _unknown_keys(raw, NODE_SCHEMA, "", "a node setting", p)
    p.check("id", raw.get("id"), validate.node_id)
    for part in NODE_PARTS:
        part.collect(raw, p)
    if "fabric" in raw:
        if "fabrics" in raw:
            p.add("fabric", "is given together with fabrics", "use fabric for one fabric, or fabrics for several")
        collect_fabric(raw["fabric"], p, "fabric")
    if "agent" not in raw:
        return None
    return _agent_source(raw["agent"], "agent", p, fallback=stack_agent, stack_pins=stack_pins)


def _node(raw: Mapping[str, Any], agent: BinarySource | None, config: Mapping[str, Any], ssh: Mapping[str, Any],
          cert: Mapping[str, Any]) -> NodeConfig:
    """A valid node's typed settings; those it does not give are the stack's."""
    given = {"servers": config.get("servers"), **raw}
    if "fabric" in raw:
        given["fabrics"] = [raw["fabric"]]
    return NodeConfig(
        node_id=raw["id"],
        connection=build(Connection, {**renamed(Connection, {**ssh, **raw}), "jump": hops_as_given(raw.get("jump", ssh.get("jump", [])))},
                         private_key_path=None),
        settings=build(AgentSettings, renamed(AgentSettings, given)),
        fail_on_engine_problems=raw.get("failOnEngineProblems", config.get("failOnEngineProblems", False)),
        agent=agent,
        key_origin=raw.get("keyOrigin", cert.get("keyOrigin", CertificateSpec.key_origin)),
        hardware=node_hardware(config.get("hardware"), raw.get("hardware")),
        fail_on_critical_problems=raw.get("failOnProblems", config.get("failOnProblems")),
    )


def node_hardware(stack: Mapping[str, Any] | None, node: Mapping[str, Any] | None) -> Hardware | None:
    """A node's declared hardware: the stack's llmgw:hardware with the node's own ``hardware`` over it, setting by
    setting (hcaPorts as a whole); None when neither declares any (validated values)."""
    merged = {**(stack or {}), **(node or {})}
    if not merged:
        return None
    built: Hardware = build(Hardware, renamed(Hardware, merged))
    return built


def _rollout(value: Any, node_ids: list[Any], p: Problems) -> Rollout | None:
    """llmgw:rollout: {maxParallel, canary}, each canary a node of this stack."""
    if value is None:
        return None
    rollout = _mapping(value, "rollout", p)
    _unknown_keys(rollout, ROLLOUT_SCHEMA, "rollout", "a rollout setting", p)
    before = len(p.items)
    collect_fields(Rollout, rollout, p, prefix="rollout.")
    canaries = rollout.get("canary", [])
    for node in [canaries] if isinstance(canaries, str) else canaries if isinstance(canaries, list) else []:
        if isinstance(node, str) and validate.node_id(node) is None and node not in node_ids:
            p.add("rollout.canary", f"{node!r} is not a node of this stack",
                  f"list ids from llmgw:nodes in llmgw:rollout.canary ({validate.did_you_mean(node, map(str, node_ids))})")
    if len(p.items) > before or not isinstance(value, Mapping):
        return None
    built: Rollout = build(Rollout, renamed(Rollout, rollout))
    return built


def _registration(value: Any, p: Problems) -> RegistrationCheck | None:
    """llmgw:registration (see llmgw_pulumi.config.registration): None when not given, or not valid."""
    if value is None:
        return None
    before = len(p.items)
    registration.collect(value, p, "registration")
    if len(p.items) > before or not isinstance(value, Mapping):
        return None
    built: RegistrationCheck = build(RegistrationCheck, renamed(RegistrationCheck, value))
    return built


def _signer(value: Any, has_ca_key: bool, p: Problems) -> SignerConfig | None:
    """llmgw:signer (see llmgw_pulumi.certificates.signer): None when not given."""
    if value is None:
        return None
    raw = _mapping(value, "signer", p)
    _unknown_keys(raw, SIGNER_SCHEMA, "signer", "a signer setting", p)
    before = len(p.items)
    kind = raw.get("kind", signer_interface.KIND_PKI_DIR)
    ca = raw.get("ca")
    if kind in (signer_interface.KIND_CA_KEY, signer_interface.KIND_COMMAND):
        p.check("signer.ca", ca, lambda v: None if isinstance(v, str) and v.strip() and "\0" not in v else (
            "is missing", "give the CA certificate (ca.pem) as a path on this machine or as its PEM text"))
    placeholder = "-----BEGIN CERTIFICATE-----"  # the program reads a path; here only its presence counts
    given = {"kind": kind, "ca_pem": placeholder, "command": raw.get("command"),
             **({"timeout_seconds": raw["timeoutSeconds"]} if "timeoutSeconds" in raw else {}),
             **({"max_parallel": raw["maxParallel"]} if "maxParallel" in raw else {})}
    for name, problem, fix in signer_interface.problems({k: v for k, v in given.items() if v is not None}):
        if name != "signer.ca":
            p.add(name, problem, fix)
    if kind == signer_interface.KIND_CA_KEY and not has_ca_key:
        p.add("caKey", "is not set, and signer.kind is caKey",
              "`pulumi config set --secret llmgw:caKey < ca-key.pem`")
    if len(p.items) > before or not isinstance(value, Mapping):
        return None
    return SignerConfig(kind=str(kind), ca=ca, command=tuple(raw.get("command") or ()),
                        timeout_seconds=raw.get("timeoutSeconds"), max_parallel=raw.get("maxParallel"))


def misspelled_namespaces(keys: Collection[str], namespace: str = NAMESPACE) -> list[tuple[str, str, str]]:
    """(key, problem, fix) for each config key (``namespace:key``, of any namespace) whose namespace is not
    ``namespace`` but nearly is (``llmwg:agent``, ``lmgw:nodes``): Pulumi keeps it, and this program never reads it."""
    found = []
    for full in sorted(keys):
        space, sep, key = full.partition(":")
        # Nearly the namespace, or somewhat near it for a key this project has (``llm:servers``).
        near_enough = 0.6 if key.split(".")[0] in SCHEMA else 0.8
        if not sep or space == namespace or not difflib.get_close_matches(space, [namespace], n=1, cutoff=near_enough):
            continue
        meant = f"{namespace}:{key}"
        near = "" if key.split(".")[0] in SCHEMA else f" ({validate.did_you_mean(key.split('.')[0], SCHEMA)})"
        found.append((full, f"is not read: its namespace {space!r} is not {namespace!r}",
                      f"did you mean {meant}?{near} Move it: `pulumi config get {shlex.quote(full)}`, "
                      f"`pulumi config set {shlex.quote(meant)} ...` (--path for a structured value, --secret for a "
                      f"secret), then `pulumi config rm {shlex.quote(full)}`"))
    return found


def parse(config: Mapping[str, Any], has_secret_key: bool = False, secret_keys: Collection[str] = (),
          has_agent: bool = False, has_ca_key: bool = False, origins: Sequence[str] = (),
          other_keys: Collection[str] = ()) -> StackSpec:
    """``config``: the llmgw:* keys without their namespace, values as YAML data.

    ``secret_keys``: other keys the stack holds as secrets, by name only (their
    values are not read, so they cannot appear in a message). ``has_agent``: an
    ssh-agent is there to log in with, so no key need be configured. ``origins``: where each node
    was written, when not in llmgw:nodes (``file line N``, from llmgw_pulumi.config.node_list), named in its problems.
    ``other_keys``: the stack's config keys of other namespaces (``ns:key``), to find a misspelled ``llmgw``.
    """
    everyone: list[tuple[str, str, str, str]] = [("llmgw", *found) for found in misspelled_namespaces(other_keys)]
    top = Problems("llmgw", Spelling.STACK_CONFIG, config_key=f"{NAMESPACE}:")
    _unknown_keys({**config, **dict.fromkeys(secret_keys)}, SCHEMA, "", "a setting of this project", top)
    # A setting held as a secret is not read: say so, rather than that it is missing.
    unread = [key for key in secret_keys if key in SCHEMA and key not in SECRET_KEYS]
    signer = _signer(config.get("signer"), has_ca_key=CA_KEY in secret_keys or has_ca_key, p=top)
    if signer is None or signer.kind == "pkiDir":
        collect_one(CertificateSpec, "pki_dir", config, top)  # required with the default signer
    for part in TOP_PARTS:
        part.collect(config, top)
    before_agent = len(top.items)
    agent = _agent_source(config.get("agent"), "agent", top)
    agent_problems = len(top.items) > before_agent
    stack_pins = config["agent"].get("sha256") if isinstance(config.get("agent"), Mapping) else None
    ssh = _mapping(config.get("ssh"), "ssh", top)
    _unknown_keys(ssh, SSH_SCHEMA, "ssh", "an ssh setting", top)
    SSH_PART.collect(ssh, top, "ssh.")
    if ssh.get("privateKeyPath"):  # made absolute by the program: `~/.ssh/id_ed25519` is fine
        top.check("ssh.privateKeyPath", ssh["privateKeyPath"], lambda v: validate.local_path(v, "path of the SSH private key"))
    if not has_secret_key and not has_agent and not ssh.get("privateKeyPath"):
        top.add("ssh.privateKeyPath", "is missing, no llmgw:sshPrivateKey secret is set and there is no ssh-agent",
                "set ssh.privateKeyPath, or `pulumi config set --secret llmgw:sshPrivateKey < key`, "
                "or run Pulumi with SSH_AUTH_SOCK pointing at an ssh-agent holding the key")
    cert = _mapping(config.get("certificate"), "certificate", top)
    _unknown_keys(cert, CERTIFICATE_SCHEMA, "certificate", "a certificate setting", top)
    CERTIFICATE_PART.collect(cert, top, "certificate.")
    check_renewal(cert, top, prefix="certificate.")
    registration_check = _registration(config.get("registration"), top)
    everyone += [("llmgw", *item) for item in top if re.split(r"[.\[]", item[0])[0] not in unread]
    everyone += [("llmgw", key, f"is set as a secret, but only {', '.join(SECRET_KEYS[:-1])} and {SECRET_KEYS[-1]} are read as secrets",
                  f"set it again without --secret: `pulumi config set llmgw:{key} ...`") for key in unread]

    raw_nodes = config.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        if "nodes" not in unread:
            nodes = Problems("llmgw", Spelling.STACK_CONFIG, config_key=f"{NAMESPACE}:")
            if raw_nodes is not None and not isinstance(raw_nodes, list):
                nodes.wrong_type("nodes", raw_nodes, "a list of nodes", [NODE_EXAMPLE])
            else:
                nodes.add("nodes", "is empty or missing",
                          f"list the nodes to onboard: {nodes.how_to_write('nodes', [NODE_EXAMPLE])}")
            everyone += [("llmgw", *item) for item in nodes]
        raw_nodes = []
    valid: list[tuple[Mapping[str, Any], BinarySource | None]] = []

    def where(i: int) -> str:
        return origins[i] if i < len(origins) else f"nodes[{i}]"

    seen_ids: dict[str, int] = {}
    seen_addrs: dict[tuple[str, Any], str] = {}
    for i, raw in enumerate(raw_nodes):
        # An invalid id (newlines, quotes...) would make a confusing label: use the position instead.
        good_id = isinstance(raw, Mapping) and validate.node_id(raw.get("id")) is None
        p = Problems((f"{where(i)} (node {raw['id']})" if origins else f"node {raw['id']}") if good_id else where(i),
                     Spelling.STACK_CONFIG, config_key=None if origins else f"{NAMESPACE}:nodes[{i}].")
        if not isinstance(raw, Mapping):
            if origins:  # a node list file's entry
                everyone.append((p.node, "entry", f"is {kind_of(raw)}, not a mapping of node settings",
                                 f"write each node as - {flow_yaml(NODE_EXAMPLE)}"))
            else:
                entry = Problems("llmgw", Spelling.STACK_CONFIG, config_key=f"{NAMESPACE}:")
                entry.wrong_type(f"nodes[{i}]", raw, "a mapping of node settings", NODE_EXAMPLE)
                everyone += [("llmgw", *item) for item in entry]
            continue
        node_id, addr = raw.get("id"), raw.get("address")
        if isinstance(node_id, str):
            if node_id in seen_ids:
                p.add("id", f"{node_id!r} is used by {where(seen_ids[node_id])} too", "give every node its own id")
            seen_ids.setdefault(node_id, i)
        if isinstance(addr, str):
            key = (addr, raw.get("port", ssh.get("port", 22)))
            if key in seen_addrs:
                p.add("address", f"{addr} is also the address of node {seen_addrs[key]}",
                      "two nodes cannot be the same machine; fix the address")
            seen_addrs.setdefault(key, str(node_id))
        node_agent = _check_node(raw, p, agent, stack_pins)
        if not p.items and not agent_problems:
            _unverified(node_agent or agent, node_agent is not None, p)
        everyone += [(p.node, *item) for item in p]
        valid.append((raw, node_agent))
    rollout_problems = Problems("llmgw", Spelling.STACK_CONFIG, config_key=f"{NAMESPACE}:")
    rollout = _rollout(config.get("rollout"), [raw.get("id") for raw, _ in valid], rollout_problems)
    everyone += [("llmgw", *item) for item in rollout_problems]
    if everyone:
        raise StackConfigError(everyone)
    return StackSpec(
        pki_dir=config.get("pkiDir"),
        agent=agent,
        ssh_private_key_path=ssh.get("privateKeyPath"),
        validity_hours=float(cert.get("validityHours", CertificateSpec.validity_hours)),
        renew_before_hours=float(cert.get("renewBeforeHours", CertificateSpec.renew_before_hours)),
        nodes=tuple(_node(raw, node_agent, config, ssh, cert) for raw, node_agent in valid),
        rollout=rollout,
        signer=signer,
        registration=registration_check,
    )
