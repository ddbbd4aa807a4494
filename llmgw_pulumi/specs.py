"""Typed inputs of the four resources, and the one place they are validated.

Pulumi delivers a resource's inputs as JSON-like dicts: numbers arrive as
floats, absent or ``None`` values arrive as missing keys, and during preview
any value may be an ``Unknown``. The stack config (stacks/Pulumi.<stack>.yaml)
says the same things in camelCase. Each spec below is a frozen dataclass whose
fields are the table of its settings: a field's name is its input name (the
key kept in state), ``setting(config=...)`` its stack-config key, and its
validator. ``collect_fields`` walks that table for either spelling, so the
provider's ``check`` and the stack-config reader report the same problem and
fix for the same bad value, each under its own name for the field.

Collecting problems never fails on an unknown value: a value that is not known
yet is checked when it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Self, cast

from pulumi.output import Output, Unknown

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


def raise_problems(collect: Callable[[Mapping[str, Any], Problems], None], props: Mapping[str, Any],
                   node: str | None = None) -> str:
    """Raise ConfigError for the first problem ``collect`` finds in ``props``; else the node's name."""
    problems = Problems(node or str(props.get("node_id", "?")))
    collect(props, problems)
    problems.raise_first()
    return problems.node


# --------------------------------------------------------------------------- the table of settings

Collect = Callable[[Any, Problems, str, bool], None]
"""(value, problems, where, config): report what is wrong with a given value under the name ``where``;
``config``: names are spelled as in the stack config."""
Schema = Mapping[str, Any]
"""A setting's sub-settings by stack-config key: None for a value, a mapping for nested settings, [mapping] for a list of them."""


def setting(config: str | None, check: Callable[[Any], validate.Problem] | None = None, *,
            collect: Collect | None = None, nested: type | None = None, convert: Callable[[Any], Any] | None = None,
            to_input: Callable[[Any], Any] | None = None, schema: Any = None, secret: bool = False,
            agent_default: Any = None, **default: Any) -> Any:
    """A field of a spec. Its name is the input name; ``config`` is the stack-config key (None: not in stack config).

    ``check`` validates one value, ``collect`` a structured one; ``nested`` is a spec of
    sub-settings. ``convert`` makes the typed value from the input (``to_input`` the reverse,
    where they differ). ``agent_default``: the agent's own default, never written as an override.
    ``default``/``default_factory`` as for ``dataclasses.field``; without them the setting is required.
    """
    if nested is not None:
        collect = collect or nested_settings(nested)
        convert = convert or (lambda value: build(nested, value))
        schema = schema or config_schema(nested)
    elif collect is None:
        assert check is not None
        collect = lambda value, problems, where, _config: problems.check(where, value, check)  # noqa: E731
    metadata = {"config": config, "collect": collect, "convert": convert, "to_input": to_input, "schema": schema,
                "nested": nested, "secret": secret, "agent_default": agent_default}
    return field(metadata=metadata, **default)


def settings_of(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in fields(cls) if "collect" in f.metadata]


def names(cls: type, config: bool) -> dict[str, str]:
    """Field name -> its key in the chosen spelling, for the settings that spelling has."""
    return {f.name: f.metadata["config"] if config else f.name for f in settings_of(cls)
            if not config or f.metadata["config"] is not None}


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def collect_fields(cls: type, props: Mapping[str, Any], problems: Problems, *, config: bool = False,
                   prefix: str = "", only: Sequence[str] | None = None, partial: bool = False) -> None:
    """Validate ``cls``'s settings in ``props`` (spelled as inputs, or as stack config), naming each as spelled.

    A setting that is absent is reported only when it is required, unless ``partial``
    (a node's settings fall back to the stack's). ``only``: these fields (by input name).
    """
    key = names(cls, config)
    for f in settings_of(cls):
        if f.name not in key or only is not None and f.name not in only:
            continue
        value = props.get(key[f.name])
        if value is None and (partial or not _required(f)):
            continue
        f.metadata["collect"](value, problems, prefix + key[f.name], config)


def collect_one(cls: type, name: str, props: Mapping[str, Any], problems: Problems, config: bool = False,
                prefix: str = "") -> None:
    """Validate one of ``cls``'s settings, whether given or not."""
    key = names(cls, config)[name]
    collector = next(f for f in settings_of(cls) if f.name == name).metadata["collect"]
    collector(props.get(key), problems, prefix + key, config)


def nested_settings(cls: type) -> Collect:
    """The collector of a mapping of ``cls``'s settings: unknown keys with the nearest one, then each setting."""
    what = f"a {cls.__name__.lower()} setting"

    def collect(value: Any, problems: Problems, where: str, config: bool) -> None:
        if not isinstance(value, Mapping):
            if not is_unknown(value):
                problems.add(where, "is not a mapping", "write it as key: value pairs")
            return
        known = names(cls, config).values()
        for k in value:
            if k not in known:
                problems.add(f"{where}.{k}", f"is not {what}", validate.did_you_mean(str(k), known))
        collect_fields(cls, value, problems, config=config, prefix=f"{where}.")

    return collect


def build(cls: type, props: Mapping[str, Any], **given: Any) -> Any:
    """``cls`` from validated inputs (input names); absent values take the field's default."""
    kwargs = {}
    for f in settings_of(cls):
        value = props.get(f.name)
        if value is not None:
            kwargs[f.name] = f.metadata["convert"](value) if f.metadata["convert"] else value
    return cls(**{**kwargs, **given})


def renamed(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``cls``'s settings among stack-config ``values``, under their input names (nested ones too)."""
    out = {}
    for name, key in names(cls, config=True).items():
        if key in values:
            nested = next(f for f in fields(cls) if f.name == name).metadata["nested"]
            out[name] = renamed(nested, values[key]) if nested and isinstance(values[key], Mapping) else values[key]
    return out


def config_schema(cls: type, only: Sequence[str] | None = None) -> dict[str, Any]:
    """``cls``'s stack-config keys and their sub-settings."""
    return {f.metadata["config"]: f.metadata["schema"] for f in settings_of(cls)
            if f.metadata["config"] is not None and (only is None or f.name in only)}


def to_inputs(value: Any) -> Any:
    """A spec, settings or Args value as a resource's inputs: dataclasses become mappings by input name
    (a field with ``flatten`` metadata merged into its parent), sequences lists; None and empty
    values are left out, as absent inputs are absent from state. Outputs are passed through."""
    if isinstance(value, Output):
        return value.apply(to_inputs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in fields(value):
            v = getattr(value, f.name)
            if v is not None and f.metadata.get("to_input"):
                v = v.apply(f.metadata["to_input"]) if isinstance(v, Output) else f.metadata["to_input"](v)
            if v is not None and f.metadata.get("secret"):
                v = Output.secret(v)
            v = to_inputs(v)
            if f.metadata.get("flatten"):
                out.update(v or {})
            elif v is not None:
                out[f.name] = v
        return out or None
    if isinstance(value, Mapping):
        return {k: to_inputs(v) for k, v in value.items()} or None
    if isinstance(value, (list, tuple)):
        return [to_inputs(v) for v in value] or None
    return value


class FromProps:
    """``from_props``: a spec from a resource's inputs, once its own ``collect`` found nothing wrong."""

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        raise NotImplementedError

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> Self:
        raise_problems(cls.collect, props)
        return cast(Self, build(cls, props))


# --------------------------------------------------------------------------- connection


def _private_key(value: object, problems: Problems, where: str, _config: bool) -> None:
    # Absent is allowed: a reviewer previews without the operator's key; the first
    # operation that needs it says it is missing. Never echo the value.
    if not is_unknown(value) and (not isinstance(value, str) or "PRIVATE KEY" not in value):
        problems.add(where, "is not a private key in PEM/OpenSSH format",
                     "give the SSH private key's contents (as a secret), or its path as private_key_path")


@dataclass(frozen=True)
class Hop:
    """A jump host (bastion) on the way to a node: it authenticates like a node, with its own host key."""

    address: str = setting("address", validate.hop)
    """user@host or user@host:port, as `ssh -J` takes it."""
    host_key: str | None = setting("hostKey", validate.host_key, convert=validate.normalise_host_key, default=None)
    """Pinned host key; otherwise the first key seen is trusted and recorded, like a node's."""

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


def _collect_jump(value: Any, problems: Problems, where: str, config: bool) -> None:
    hops = hops_as_given(value) if config else value
    if is_unknown(hops) and not isinstance(hops, (list, tuple)):
        return
    if not isinstance(hops, (list, tuple)):
        problems.add(where, "is not a list of jump hosts", "write jump: deploy@bastion, or a list of user@host[:port]")
        return
    for i, h in enumerate(hops):
        if not isinstance(h, Mapping):
            problems.add(f"{where}[{i}]", "is not a jump host", "write each jump host as user@host[:port]")
            continue
        collect_fields(Hop, h, problems, prefix=f"{where}[{i}].")


def _any_secret(value: object, problems: Problems, where: str, _config: bool) -> None:
    if not is_unknown(value) and not isinstance(value, str):  # never echo the value
        problems.add(where, "is not text", "set it as a secret string")


@dataclass(frozen=True)
class Connection:
    """How to reach a node over SSH (``ConnectionArgs``). ``private_key`` is secret; it is never shown in repr.

    Given to a resource or to Node, any value may be a pulumi Output.
    """

    host: str = setting("address", validate.address)
    user: str = setting("user", validate.ssh_user, default="root")
    private_key: str | None = setting(None, collect=_private_key, secret=True, default=None, repr=False)
    """The key itself (a secret in state), or None when it is read from ``private_key_path``."""
    port: int = setting("port", validate.port, convert=int, default=22)
    host_key: str | None = setting("hostKey", validate.host_key, convert=validate.normalise_host_key, default=None)
    """Pinned host key as 'TYPE BASE64' (a .pub file's comment dropped). When absent the first key seen is trusted and recorded."""
    wait: float = setting("wait", validate.ssh_wait, convert=float, default=DEFAULT_SSH_WAIT)
    """Seconds to keep retrying while the node refuses SSH (cloud-init restarts sshd)."""
    private_key_path: str | None = setting(
        "privateKeyPath", lambda v: validate.abs_path(v, "path of the SSH private key"), default=None)
    """Where the key is on the machine running Pulumi: then the key never enters state at all."""
    passphrase: str | None = setting(None, collect=_any_secret, secret=True, default=None, repr=False)
    """The passphrase of a protected key (a secret); a key in ssh-agent needs none."""
    jump: tuple[Hop, ...] = setting("jump", collect=_collect_jump, default=(),
                                    convert=lambda hops: tuple(build(Hop, h) for h in hops))
    """Jump hosts, outermost first (`ssh -J`); each one's connection carries every node behind it."""

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
        collect_fields(Connection, props, problems, prefix=f"{prefix}.")

    @classmethod
    def from_props(cls, props: Mapping[str, Any], node: str) -> Connection:
        raise_problems(cls.collect, props, node)
        return build(cls, props)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- certificate


def check_renewal(props: Mapping[str, Any], problems: Problems, config: bool = False, prefix: str = "") -> None:
    """The renewal window must be shorter than the validity."""
    key = names(CertificateSpec, config)
    v = props.get(key["validity_hours"], DEFAULT_VALIDITY_HOURS)
    r = props.get(key["renew_before_hours"], DEFAULT_RENEW_BEFORE_HOURS)
    if isinstance(v, (int, float)) and isinstance(r, (int, float)) and r >= v:
        problems.add(prefix + key["renew_before_hours"], f"{r:g} is not shorter than the validity ({v:g} h)",
                     "renew some time before expiry, e.g. a tenth of the validity")


KEY_ORIGIN_NODE, KEY_ORIGIN_OPERATOR = "node", "operator"


def _certificate_connection(value: object, problems: Problems, where: str, _config: bool) -> None:
    if value is not None:
        Connection.collect(value, problems, where)


def _certificate_signer(value: object, problems: Problems, where: str, _config: bool) -> None:
    from . import signer  # stdlib only: no cryptography in a preview

    if not is_unknown(value):
        for name, problem, fix in signer.problems(value):
            problems.add(name, problem, fix)


@dataclass(frozen=True)
class CertificateSpec(FromProps):
    node_id: str = setting("id", validate.node_id)
    pki_dir: str | None = setting("pkiDir", lambda v: validate.abs_path(v, "PKI directory (holding ca.pem and ca-key.pem)"),
                                  default=None)
    """The signer pkiDir's directory (the default signer); None with another signer."""
    validity_hours: float = setting("validityHours", validate.hours, convert=float, default=DEFAULT_VALIDITY_HOURS)
    renew_before_hours: float = setting("renewBeforeHours", validate.hours, convert=float,
                                        default=DEFAULT_RENEW_BEFORE_HOURS)
    key_origin: str = setting("keyOrigin", validate.key_origin, default=KEY_ORIGIN_NODE)
    """Where the node's key pair is made: on the node (``node``: it never leaves it) or here (``operator``)."""
    connection: Connection | None = setting(None, collect=_certificate_connection, default=None,
                                            convert=lambda c: None if c is None else build(Connection, c))
    """How to reach the node, for a key made on it (keyOrigin node); None with keyOrigin operator."""
    signer: Mapping[str, Any] | None = setting(None, collect=_certificate_signer, default=None)
    """How the certificate is signed (llmgw_pulumi.signer.SignerSpec as inputs); None: from pki_dir."""
    ca_key_passphrase: str | None = setting(None, collect=_any_secret, secret=True, default=None, repr=False)
    """The passphrase of an encrypted ca-key.pem (a secret: stack config ``llmgw:caKeyPassphrase``); None: the
    key is not encrypted."""

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


# --------------------------------------------------------------------------- what agent.yaml says


def _on_node(what: str) -> Callable[[Any], validate.Problem]:
    return lambda value: validate.abs_path(value, what, on_node=True)


def collect_servers(servers: Any, problems: Problems, where: str, _config: bool) -> None:
    """Control planes as host:port, in failover order, each once."""
    if is_unknown(servers) and not isinstance(servers, (list, tuple)):
        return
    if not isinstance(servers, (list, tuple)) or not servers:
        problems.add(where, "is empty or missing", 'list the control planes as host:port, e.g. ["cp1.example.net:7443"]')
        return
    for i, s in enumerate(servers):
        problems.check(f"{where}[{i}]", s, validate.server)
    known = [s for s in servers if isinstance(s, str)]
    if len(set(known)) != len(known):
        problems.add(where, "lists a control plane twice", "list each control plane once, in failover order")


FABRIC_SCHEMA: Schema = {"name": None, "hcas": None}


def collect_fabric(fab: Any, problems: Problems, where: str, _config: bool = False) -> None:
    """One fabric: {name, hcas}."""
    if not isinstance(fab, Mapping):
        if not is_unknown(fab):
            problems.add(where, "is not a {name, hcas} mapping", "write each fabric as {name: ib-east, hcas: [mlx5_0]}")
        return
    for key in fab:
        if key not in FABRIC_SCHEMA:
            problems.add(f"{where}.{key}", "is not a fabric setting", validate.did_you_mean(str(key), FABRIC_SCHEMA))
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


def collect_fabrics(fabrics: Any, problems: Problems, where: str, config: bool = False) -> None:
    """A list of {name, hcas}, each fabric once."""
    if is_unknown(fabrics) and not isinstance(fabrics, (list, tuple)):
        return
    if not isinstance(fabrics, (list, tuple)):
        problems.add(where, "is not a list", "write fabrics as a list of {name, hcas}")
        return
    seen: set[str] = set()
    for i, fab in enumerate(fabrics):
        collect_fabric(fab, problems, f"{where}[{i}]", config)
        name = fab.get("name") if isinstance(fab, Mapping) else None
        if isinstance(name, str):
            if name in seen:
                problems.add(f"{where}[{i}].name", f"fabric {name!r} is listed twice", "list each fabric once")
            seen.add(name)


def collect_engines(engines: Any, problems: Problems, where: str = "engines", _config: bool = False) -> None:
    if is_unknown(engines) and not isinstance(engines, Mapping):
        return
    if not isinstance(engines, Mapping):
        problems.add(where, "is not a mapping",
                     "write engines as {llamacpp: {bin: PATH}, vllm: {bin: PATH}, sglang: {python: PATH}}")
        return
    for name, conf in engines.items():
        if name not in ENGINE_KEYS:
            problems.add(f"{where}.{name}", "is not an engine the agent knows", f"use one of {', '.join(ENGINE_KEYS)}")
            continue
        key = ENGINE_KEYS[name]
        if not isinstance(conf, Mapping) or set(conf) - {key}:
            problems.add(f"{where}.{name}", f"must be {{{key}: PATH}}", f"write engines.{name}.{key}: /absolute/path")
            continue
        problems.check(f"{where}.{name}.{key}", conf.get(key), _on_node(f"{name} executable"))


def engine_map(engines: Mapping[str, Any]) -> dict[str, str]:
    """engine -> executable path from the inputs' {engine: {bin|python: PATH}}, in ENGINE_KEYS order."""
    return {name: engines[name][key] for name, key in ENGINE_KEYS.items() if name in engines and engines[name].get(key)}


def engines_input(engines: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The inputs' {engine: {bin|python: PATH}} from engine -> executable path."""
    return {name: {ENGINE_KEYS[name]: path} for name, path in engines.items()}


@dataclass(frozen=True)
class Fabric:
    """An InfiniBand fabric the node is cabled to, and its HCAs on it (never guessed: SPEC step 6)."""

    name: str
    hcas: Sequence[str]


def _fabrics(fabrics: Sequence[Mapping[str, Any]]) -> tuple[Fabric, ...]:
    return tuple(Fabric(f["name"], tuple(f["hcas"])) for f in fabrics)


@dataclass(frozen=True)
class Discovery:
    """Where the agent finds what it discovers; each written only when it differs from the agent's default."""

    nvidia_smi: str | None = setting("nvidiaSmi", _on_node("path of nvidia-smi"), default=None)
    ib_root: str | None = setting("ibRoot", _on_node("InfiniBand sysfs directory"), default=None,
                                  agent_default=DEFAULT_IB_ROOT)

    def overrides(self) -> dict[str, str]:
        """The settings given that differ from the agent's defaults, by agent.yaml key."""
        return {f.name: getattr(self, f.name) for f in settings_of(Discovery)
                if getattr(self, f.name) not in (None, f.metadata["agent_default"])}


@dataclass(frozen=True)
class AgentSettings(FromProps):
    """What agent.yaml says beyond the TLS paths and the node id: only the overrides given (SPEC step 6).

    The one type for these settings: ``NodeArgs.settings`` and ``AgentInstallArgs.settings``
    take it (any value may be a pulumi Output there), the program builds it from stack
    config, and AgentInstall's provider renders agent.yaml from it. In state each field
    is an input of AgentInstall under its own name.
    """

    servers: Sequence[str] = setting("servers", collect=collect_servers, convert=tuple)
    """Control planes as host:port; several in failover order."""
    mgmt_addr: str | None = setting("mgmtAddr", validate.address, default=None)
    mgmt_interface: str | None = setting("mgmtInterface", validate.interface, default=None)
    fabrics: Sequence[Fabric] = setting("fabrics", collect=collect_fabrics, schema=[FABRIC_SCHEMA], default=(),
                                        convert=_fabrics)
    discovery: Discovery = setting("discovery", nested=Discovery, default=Discovery())
    engines: Mapping[str, str] = setting("engines", collect=collect_engines, convert=engine_map, to_input=engines_input,
                                         schema={e: {k: None} for e, k in ENGINE_KEYS.items()}, default_factory=dict)
    """engine -> its executable on the node (sglang: its python), each only when given."""

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        collect_fields(AgentSettings, props, problems)


# --------------------------------------------------------------------------- the binary


FETCH_NODE, FETCH_OPERATOR = "node", "operator"


def _signing_key(value: object) -> validate.Problem:
    try:
        validate.normalise_host_key(value)  # type: ignore[arg-type]  # a non-str is refused like a bad key
    except (ValueError, TypeError):
        return ("is not an OpenSSH public key",
                "paste the public half of the release signing key, one line: 'ssh-ed25519 AAAAC3...' "
                "(`ssh-keygen -y -f KEY` prints it)")
    return None


def _fetch(value: object) -> validate.Problem:
    if value in (FETCH_NODE, FETCH_OPERATOR):
        return None
    return (f"{value!r} is not node or operator",
            "write node (each node downloads the release itself; the default) or operator (downloaded and "
            "verified here, pushed to the nodes over SSH: for nodes that cannot reach the release server)")


def _digests(value: object) -> validate.Problem:
    from .release import digests_problem  # the release module imports urllib and ssl: only when a digest is given

    return digests_problem(value)


@dataclass(frozen=True)
class BinarySource(FromProps):
    """Where /usr/local/bin/llmgw comes from (SPEC step 5).

    A release tag is downloaded from ``release_url`` (by the node, or with
    ``fetch: operator`` by the operator's side, which pushes it) and must have
    the sha256 the operator's side approved for the node's architecture
    (``release_sha256``: pinned in stack config as ``sha256``, or read from the
    release's checksums.txt, signed by ``signing_key`` when given; see
    llmgw_pulumi.release), and report the tag as its ``--version``. Any other
    version is the local binary at ``binary_path``, copied as is (its sha256 is
    an input, so a rebuilt binary shows up in the preview). In stack config,
    ``binary`` is the local build whose ``--version`` gives the version.

    ``release_sha256``, ``signing_key``, ``release_ca`` and ``fetch`` say how a
    release is verified and carried: never a change to a node by themselves,
    and not compared by the diff (a preview, which fetches nothing, does not
    know the digests).
    """

    version: str = setting("version", validate.version)
    release_url: str | None = setting("releaseUrl", validate.url, convert=lambda u: u.rstrip("/") or None, default=None)
    binary_path: str | None = setting("binary", lambda p: validate.abs_path(p, "local binary path"), default=None)
    binary_sha256: str | None = setting(None, lambda s: None if isinstance(s, str) and len(s) == 64 else (
        "is missing", "compute it from the local binary (the node component does)"), default=None)
    release_sha256: Mapping[str, str] | None = setting("sha256", _digests, default=None,
                                                       convert=lambda d: {a: h.lower() for a, h in d.items()})
    """arch -> the sha256 the release's binary must have: agent.sha256 (a pin), or as the operator's side read it."""
    signing_key: str | None = setting("signingKey", _signing_key, convert=validate.normalise_host_key, default=None)
    """The OpenSSH public key whose signature checksums.txt must carry (namespace llmgw-release)."""
    release_ca: str | None = setting("releaseCa", lambda p: validate.abs_path(p, "CA bundle of the release server"),
                                     default=None)
    """A PEM bundle on the operator's machine: the only CA trusted for the release server (None: the system's)."""
    fetch: str | None = setting("fetch", _fetch, default=None)
    """Who downloads a release: ``node`` (None: the default) or ``operator`` (pushed to the node over SSH)."""

    RELEASE_FIELDS = ("release_sha256", "signing_key", "release_ca", "fetch")
    """How a release is verified and carried (see above)."""

    @property
    def is_release(self) -> bool:
        return bool(validate.RELEASE_TAG.match(self.version))

    @property
    def fetched_here(self) -> bool:
        return self.fetch == FETCH_OPERATOR

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems, config: bool = False, prefix: str = "") -> None:
        """A release tag with its URL, or another version with the local binary to copy.

        In stack config the binary is the local build, read later: there, it needs no version.
        """
        key = names(BinarySource, config)
        for name in ("release_sha256", "signing_key", "fetch") + (() if config else ("release_ca",)):
            if props.get(key[name]) is not None:
                collect_one(BinarySource, name, props, problems, config, prefix)
        if config and props.get(key["release_ca"]) is not None:
            problems.check(prefix + key["release_ca"], props.get(key["release_ca"]), lambda v: None if isinstance(
                v, str) and v else ("is empty", "give the path of the release server's CA bundle (PEM) on this machine"))
        version, binary = props.get(key["version"]), props.get(key["binary_path"])
        if config and binary is not None and props.get(key["release_sha256"]) is not None:
            problems.add(prefix + key["release_sha256"], "pins a release, but a local build is given",
                         "remove sha256 (a local build is copied as it is), or give a release version instead of binary")
        if config and version is None and binary is not None:
            return
        problems.check(prefix + key["version"], version, validate.version)
        if is_unknown(version) or not isinstance(version, str) or validate.version(version):
            return
        if validate.RELEASE_TAG.match(version):
            collect_one(BinarySource, "release_url", props, problems, config, prefix)
        elif binary is None:
            problems.add(prefix + key["binary_path"],
                         f"is missing: version {version} is not a release tag, so there is no release to fetch",
                         "give the local llmgw build to copy, or a release tag vX.Y.Z")
        elif not config:
            collect_one(BinarySource, "binary_path", props, problems)
            collect_one(BinarySource, "binary_sha256", props, problems)


# --------------------------------------------------------------------------- rollout


def collect_canaries(value: Any, problems: Problems, where: str, _config: bool) -> None:
    """A list of node ids, each once (that each is a node of the stack, the stack config checks)."""
    if is_unknown(value) and not isinstance(value, (list, tuple)):
        return
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        problems.add(where, "is not a list of node ids", "write canary: [gpu-01], the ids of the nodes to update first")
        return
    for i, node in enumerate(value):
        problems.check(f"{where}[{i}]", node, validate.node_id)
    if len(set(map(str, value))) != len(value):
        problems.add(where, "lists a node twice", "list each canary once")


def canaries_as_given(value: Any) -> tuple[str, ...]:
    """One node id or a list of them (validated) as a tuple."""
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Rollout:
    """How updates of running agents are spread (stack config ``llmgw:rollout``; see llmgw_pulumi.rollout).

    ``directory`` is the stack's coordination directory on the operator's machine
    (the program sets it); it is not a stack-config setting.
    """

    max_parallel: int | None = setting("maxParallel", validate.positive_int, convert=int, default=None)
    """At most this many agents restart at once, across the whole stack; None: no limit."""
    canaries: tuple[str, ...] = setting("canary", collect=collect_canaries, convert=canaries_as_given, default=())
    """Node ids updated first; the others start only once these succeeded."""
    directory: str | None = setting(None, lambda v: validate.abs_path(v, "rollout coordination directory"), default=None)


# --------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class AgentSpec:
    node_id: str
    connection: Connection
    settings: AgentSettings
    binary: BinarySource
    hostname: str
    rollout: Rollout | None = None

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        problems.check("node_id", props.get("node_id"), validate.node_id)
        Connection.collect(props.get("connection"), problems)
        AgentSettings.collect(props, problems)
        BinarySource.collect(props, problems)
        if props.get("rollout") is not None:
            nested_settings(Rollout)(props["rollout"], problems, "rollout", False)
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
            rollout=build(Rollout, props["rollout"]) if props.get("rollout") else None,
        )


# --------------------------------------------------------------------------- engine check


@dataclass(frozen=True)
class EngineCheckSpec:
    node_id: str
    connection: Connection
    engines: tuple[tuple[str, str], ...]
    """(engine, executable path) pairs in ENGINE_KEYS order."""
    fail_on_problems: bool = setting("failOnEngineProblems", validate.boolean, default=False)
    # What the inventory checks the node's hardware against, as AgentSettings says it (inputs only, optional:
    # a stack whose state predates them, or that declares none, has nothing to compare).
    fabrics: Sequence[Fabric] = setting(None, collect=collect_fabrics, default=(), convert=_fabrics)
    discovery: Discovery = setting(None, nested=Discovery, default=Discovery())

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
