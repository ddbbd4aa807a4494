"""``Node`` as a component of a Pulumi package, for programs in any Pulumi language (TypeScript, Go, ...).

This repository is a source-based plugin package (PulumiPlugin.yaml): a
consumer runs ``pulumi package add <this directory or its git URL>``, which
generates an SDK in the consumer's language, and the engine runs this module's
``Node`` through the Python language host (``llmgw_pulumi.component_host``).

Its inputs are one node as the stack config gives it, under the stack
config's own keys: the node's settings (``id``, ``address``, ``hostKey``,
``fabrics``, ``engines``, its own ``agent``...) beside the stack-wide ones
(``pkiDir`` or ``signer``, ``servers``, ``agent``, ``ssh``, ``certificate``,
``rollout``...). Their types are made by ``declared_settings`` from the
package's own declarations (the spec tables of llmgw_pulumi.specs and the
stack-config schema of llmgw_pulumi.stack_config), never from a second copy,
and they are checked by ``stack_config.parse`` itself: a bad value gets the
stack config's list of every problem, each naming the node, the field and
the fix, before anything is registered.

Only ``address`` and ``hostKey`` (a VM's outputs) and the secrets may be
outputs of other resources; every other input is a plain value, so it is
checked before anything happens. Its outputs are plain values: hostname,
host key, certificate expiry, agent version, problems and inventory.

``depends_on`` and ``replace_with`` given to the component reach its four
resources, and each node runs in its shard's provider process
(llmgw_pulumi.shards), as with the Python ``Node``.
"""

import ast
import dataclasses
import inspect
import os
import re
import subprocess
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, Required, TypedDict

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.output import Unknown

from . import errors, program, rollout, specs, stack_config
from .agent_settings import FABRIC_SCHEMA, AgentSettings, BinarySource, Fabric
from .errors import LlmgwError
from .node import NodeArgs, onboard
from .schema import settings_of
from .shards import provider_for
from .signer import KIND_CA_KEY
from .specs import (
    CertificateSpec,
    Connection,
    EngineCheckSpec,
    Rollout,
)

PACKAGE_NAME = "llmgw"
"""The package's name in the consumer's program (``@pulumi/llmgw``, ``.../sdks/llmgw``), and in the type token."""

OUTPUT_CAPABLE = ("address", "hostKey")
"""The inputs (besides the secrets) that may be another resource's outputs: what a VM's create tells."""

SECRETS = {stack_config.SECRET_KEY: "private_key", stack_config.PASSPHRASE_KEY: "passphrase",
           stack_config.CA_PASSPHRASE_KEY: "ca_key_passphrase", stack_config.CA_KEY: "ca_key"}
"""The secret settings, which the stack config reads with ``--secret``: here, inputs (made secret)."""

RENAMED = {"id": "nodeId"}
"""Stack-config keys the component spells otherwise: the SDKs take ``id`` for the resource's own (and drop it)."""

VIRTUALENV_ENV = "PULUMI_RUNTIME_VIRTUALENV"
"""Where the dynamic-provider plugin looks for its Python (a virtualenv), as the engine gives it the environment."""


# --------------------------------------------------------------------------- the declared settings


@dataclass(frozen=True)
class Declared:
    """One setting as the package declares it: its stack-config key, value type, doc and sub-settings."""

    key: str
    type: Any
    """str, float, int, bool, list[...] or dict[str, ...] of those; None for a mapping of ``children``."""
    doc: str
    children: tuple["Declared", ...] = ()
    many: bool = False
    """A list of mappings of ``children`` (``fabrics``, ``jump``)."""
    name: str = ""
    """For a mapping: the name of its type."""


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under a class's annotated attributes (what dataclass fields are documented with)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    for stmt, after in zip(body.body, body.body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def _module_docs(module: Any) -> dict[str, str]:
    """The docstrings under a module's constants (stack_config documents its secret keys so)."""
    body = ast.parse(inspect.getsource(module)).body
    return {stmt.targets[0].id: " ".join(after.value.value.split())
            for stmt, after in zip(body, body[1:], strict=False)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}


def _class_doc(cls: type) -> str:
    """A spec's own first paragraph; "" for the signature a dataclass without a docstring is given."""
    doc = " ".join((cls.__doc__ or "").split("\n\n")[0].split())
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def _plain(tp: Any) -> Any:
    """A spec field's type as a plain value type: Optional dropped, sequences lists, mappings dicts."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, __import__("types").UnionType) and len(args) == 1:
        return _plain(args[0])
    if origin in (tuple, list, Sequence, typing.get_origin(Sequence[str])):
        return list[_plain(args[0])]  # type: ignore[misc]
    if origin in (dict, Mapping, typing.get_origin(Mapping[str, str])):
        return dict[str, _plain(args[1])]  # type: ignore[misc]
    return tp


def _pascal(path: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[.\[\]]+", path) if part)


def _from_class(cls: type, schema: Mapping[str, Any], path: str, extra: Sequence[type] = ()) -> tuple[Declared, ...]:
    """The settings of ``schema`` (stack-config keys -> sub-schema) as ``cls`` (and ``extra``) declare them."""
    declared: list[Declared] = []
    for key, sub in schema.items():
        for owner in (cls, *extra):
            hints = typing.get_type_hints(owner)
            found = [f for f in settings_of(owner) if f.metadata["config"] == key] if dataclasses.is_dataclass(owner) \
                else []
            if not found and key in hints and not settings_of(owner):  # a plain dataclass (Fabric): names are keys
                declared.append(_setting(owner, key, key, hints[key], sub, path))
                break
            if found:
                declared.append(_setting(owner, found[0].name, key, hints[found[0].name], sub, path, found[0]))
                break
        else:
            raise LookupError(f"{path}{key}: no declaration in {cls.__name__}")
    return tuple(declared)


def _setting(owner: type, name: str, key: str, tp: Any, sub: Any, path: str,
             f: dataclasses.Field[Any] | None = None) -> Declared:
    # The declaration's doc (schema.setting(doc=...)); else the attribute docstring (plain dataclasses: Fabric).
    doc = (f.metadata.get("doc") if f is not None else "") or _attribute_docs(owner).get(name, "")
    nested = f.metadata.get("nested") if f is not None else None
    plain = _plain(tp)
    item = typing.get_args(plain)[0] if typing.get_origin(plain) is list else None
    if nested is not None or dataclasses.is_dataclass(plain):
        cls = typing.cast(type, nested or plain)
        return Declared(key, None, doc, _from_class(cls, sub or _keys_of(cls), f"{path}{key}."), name=cls.__name__)
    if item is not None and dataclasses.is_dataclass(item):
        item = typing.cast(type, item)
        item_schema = sub[0] if isinstance(sub, list) else _keys_of(item)
        return Declared(key, None, doc, _from_class(item, item_schema, f"{path}{key}[]."), many=True, name=item.__name__)
    if isinstance(sub, Mapping):  # a mapping declared by its schema only (engines): its leaves are text (paths)
        return _from_schema(key, sub, doc, path)
    return Declared(key, plain, doc)


def _keys_of(cls: type) -> dict[str, None]:
    return {f.metadata["config"]: None for f in settings_of(cls) if f.metadata["config"]} or \
        dict.fromkeys(typing.get_type_hints(cls))


def _from_schema(key: str, schema: Mapping[str, Any], doc: str, path: str) -> Declared:
    children = tuple(_from_schema(k, sub, "", f"{path}{key}.") if isinstance(sub, Mapping) else Declared(k, str, "")
                     for k, sub in schema.items())
    return Declared(key, None, doc, children, name=_pascal(f"{path}{key}"))


def declared_settings() -> tuple[Declared, ...]:
    """Every setting of one node as the stack config declares it: the node's own, then the stack-wide ones.

    The one adapter from the package's declarations to the component's inputs:
    the stack config's schema (stack_config.SCHEMA, NODE_SCHEMA) gives the keys
    and their nesting, the spec tables (llmgw_pulumi.specs) each key's type and
    doc. A key the schema has and no spec declares is an error here, so the two
    cannot drift apart unseen.
    """
    node_classes = (CertificateSpec, Connection, AgentSettings, EngineCheckSpec)
    node_schema = {k: v for k, v in stack_config.NODE_SCHEMA.items() if k not in ("agent", "fabric")}
    declared = list(_from_class(Connection, node_schema, "", node_classes))
    fabric = _setting(AgentSettings, "fabrics", "fabric", Fabric, FABRIC_SCHEMA, "")
    declared.append(dataclasses.replace(fabric, doc="One fabric (instead of fabrics): " + fabric.doc))
    top = {k: v for k, v in stack_config.SCHEMA.items() if k not in {*stack_config.NODE_SCHEMA, "nodes", "inventory", *SECRETS}}
    sections = {"agent": BinarySource, "ssh": Connection, "certificate": CertificateSpec, "rollout": Rollout}
    agent_doc = _class_doc(BinarySource)
    for key in ("servers", "failOnEngineProblems"):
        declared = [d for d in declared if d.key != key]
    declared += _from_class(AgentSettings, {"servers": None}, "")
    declared += _from_class(EngineCheckSpec, {"failOnEngineProblems": None}, "")
    declared.append(Declared("agent", None, agent_doc, _from_class(BinarySource, stack_config.AGENT_SCHEMA, "agent."),
                             name="Agent"))
    for key, sub in top.items():
        if key in sections and key != "agent":
            cls = sections[key]
            declared.append(Declared(key, None, _class_doc(cls), _from_class(cls, sub, f"{key}."), name=_pascal(key)))
        elif key == "signer":
            declared.append(_from_schema(key, sub, "How certificates are signed: {kind: pkiDir|caKey|command, ca, "
                                         "command, timeoutSeconds, maxParallel} (docs/operations.md, Signers).", ""))
        elif sub is None:
            declared += _from_class(CertificateSpec, {key: None}, "")
    docs = _module_docs(stack_config)
    constant = {getattr(stack_config, name): doc for name, doc in docs.items() if isinstance(getattr(stack_config, name,
                                                                                               None), str)}
    declared += [Declared(key, str, constant.get(key, "")) for key in SECRETS]
    return tuple(dataclasses.replace(d, key=RENAMED.get(d.key, d.key)) for d in declared)


# --------------------------------------------------------------------------- the component's types


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def _typed_dict(name: str, settings: Sequence[Declared], doc: str, required: Sequence[str] = (),
                inputs: Sequence[str] = ()) -> type:
    """A TypedDict of ``settings`` (snake_case: the component analyzer spells them back in camelCase)."""
    fields: dict[str, Any] = {}
    for d in settings:
        tp = d.type if d.children == () else _typed_dict(d.name, d.children, d.doc)
        tp = types.GenericAlias(list, (tp,)) if d.many else tp
        tp = typing.cast(Any, pulumi.Input)[tp] if d.key in inputs else tp
        fields[_snake(d.key)] = typing.cast(Any, Required if d.key in required else NotRequired)[tp]
    made = typing.cast(Any, TypedDict)(name, fields)
    made.__doc__ = doc
    return typing.cast(type, made)


def input_type() -> type:
    """The component's input type: one node's settings, spelled as in the stack config."""
    return _typed_dict("NodeArgs", declared_settings(), "One node's settings, as the stack config gives them.",
                       required=(RENAMED["id"], "address"),
                       inputs=(*OUTPUT_CAPABLE, *SECRETS))


def schema_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    """The package schema with each input property documented from its declaration (the analyzer reads
    docs from source, which generated types do not have)."""
    def walk(props: dict[str, Any], settings: Sequence[Declared]) -> None:
        by_key = {d.key: d for d in settings}
        for key, prop in props.items():
            d = by_key.get(key)
            if d is None:
                continue
            if d.doc:
                prop["description"] = d.doc
            if d.children:
                ref = (prop.get("items") or prop).get("$ref", "")
                target = schema.get("types", {}).get(ref.removeprefix("#/types/"))
                if target is not None:
                    walk(target.get("properties", {}), d.children)

    for resource in schema.get("resources", {}).values():
        walk(resource.get("inputProperties", {}), declared_settings())
    return schema


# --------------------------------------------------------------------------- reading the inputs


@dataclass(frozen=True)
class Parsed:
    """A component's inputs checked as stack config: the node, the stack-wide settings, the outputs kept aside."""

    spec: stack_config.StackSpec
    node: stack_config.NodeConfig
    raw: dict[str, Any]
    outputs: dict[str, pulumi.Output[Any]]
    """The inputs that are other resources' outputs (``OUTPUT_CAPABLE``), to be given to the resources as such."""
    secrets: dict[str, pulumi.Output[str]]


UNKNOWN: Any = Unknown()  # type: ignore[no-untyped-call]
"""What a value not known yet is to the checks (llmgw_pulumi.specs.is_unknown)."""


def _known(value: Any) -> Any:
    """``value`` with every output replaced by Unknown: what the stack config's checks skip (checked when known);
    a whole number as YAML gives it (the engine sends every number as a float: 22.0 is the port 22)."""
    if isinstance(value, pulumi.Output):
        return UNKNOWN
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _known(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_known(v) for v in value]
    return value


def parse(name: str, inputs: Mapping[str, Any]) -> Parsed:
    """The component's inputs (stack-config keys) checked by ``stack_config.parse`` as a one-node stack.

    Raises InputPropertiesError listing every problem (node, field, fix), before anything is registered.
    """
    node_keys = set(stack_config.NODE_SCHEMA) - {"agent", "servers", "failOnEngineProblems"}
    spelled = {v: k for k, v in RENAMED.items()}
    given = {spelled.get(k, k): v for k, v in inputs.items() if v is not None}
    secrets = {k: v if isinstance(v, pulumi.Output) else pulumi.Output.secret(v)
               for k, v in given.items() if k in SECRETS}
    outputs = {k: v for k, v in given.items() if isinstance(v, pulumi.Output) and k not in SECRETS}
    problems: list[tuple[str, str, str, str]] = []
    for key, value in given.items():
        if key not in (*OUTPUT_CAPABLE, *SECRETS) and specs.is_unknown(_known(value)):
            problems.append((f"node {name}", key, "is another resource's output, which cannot be checked before the "
                             "node is registered", f"give {key} as a plain value; only {' and '.join(OUTPUT_CAPABLE)} "
                             "may be outputs (a VM's address and host key)"))
    top = {k: _known(v) for k, v in given.items() if k not in node_keys and k not in SECRETS}
    node = {k: _known(v) for k, v in given.items() if k in node_keys}
    try:
        spec = stack_config.parse({**top, "nodes": [node]}, has_secret_key=stack_config.SECRET_KEY in secrets,
                                  secret_keys=(), has_agent=bool(os.environ.get("SSH_AUTH_SOCK")),
                                  has_ca_key=stack_config.CA_KEY in secrets)
    except stack_config.StackConfigError as exc:
        problems += [(f"node {name}", _input_name(field), problem, fix) for _, field, problem, fix in exc.problems]
    if problems:
        # The list, as the stack config prints it; an empty list of property errors (None fails in the SDK).
        raise InputPropertiesError(errors.problems_text(problems, f"llmgw Node {name}"), [])
    return Parsed(spec, spec.nodes[0], given, outputs, secrets)


def _input_name(field: str) -> str:
    """A stack-config field name as the component's input is called."""
    head, sep, rest = field.partition(".")
    return RENAMED.get(head, head) + sep + rest


def package_virtualenv() -> str:
    """The virtualenv scripts/install.sh made beside this package (README, "From TypeScript or Go"), when this
    package is a checkout that has one; else the one this process runs in (the plugin's, .venv-plugin)."""
    made = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv")
    return made if os.path.exists(os.path.join(made, "bin", "python")) else sys.prefix


def python_problem(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the dynamic-provider plugin, started by the engine from the consumer's project, would find no Python
    with this package; None when it will. It runs the virtualenv ``VIRTUALENV_ENV`` names, else
    ``PULUMI_PYTHON_CMD`` or ``python3`` (pulumi-resource-pulumi-python)."""
    env = os.environ if environ is None else environ
    venv = env.get(VIRTUALENV_ENV, "")
    python = os.path.join(venv, "bin", "python") if venv else env.get("PULUMI_PYTHON_CMD") or "python3"
    if venv and not os.path.isabs(venv):
        return None  # relative to the consumer's project, which this process does not know: the plugin says
    try:
        found = subprocess.run([python, "-c", "import llmgw_pulumi, pulumi.dynamic"], capture_output=True,
                               timeout=60, check=False).returncode == 0
    except OSError:
        found = False
    if found:
        return None
    where = f"{VIRTUALENV_ENV}={venv}" if venv else f"{python} (no {VIRTUALENV_ENV} is set)"
    return (f"llmgw Node {name}: the dynamic-provider plugin would run {where}, which does not have llmgw-pulumi\n"
            f"  fix: export {VIRTUALENV_ENV}={package_virtualenv()} (this package's virtualenv) before `pulumi up`, "
            "or see the README, \"From TypeScript or Go\"")


# --------------------------------------------------------------------------- the component


_started_runs: set[tuple[Any, ...]] = set()


def _rollout(spec: stack_config.StackSpec) -> Rollout | None:
    """llmgw:rollout with its coordination directory, the run started once per deployment (not once per node)."""
    if spec.rollout is None:
        return None
    key = (pulumi.get_organization(), pulumi.get_project(), pulumi.get_stack())
    directory = rollout.stack_dir(os.getcwd(), *key)
    if not pulumi.runtime.is_dry_run() and (*key, os.getppid()) not in _started_runs:
        _started_runs.add((*key, os.getppid()))
        rollout.start_run(directory)
    return dataclasses.replace(spec.rollout, directory=str(directory))


def node_args(parsed: Parsed) -> NodeArgs:
    """The Python ``NodeArgs`` of a parsed component, as the stack program builds them (program.node_args)."""
    spec, n = parsed.spec, parsed.node
    secrets = {k: v for k, v in parsed.secrets.items()}
    registration = program.Registration(
        spec, {n.node_id: program.agent_inputs(n.agent or spec.agent)}, program.ssh_credentials(spec, secrets),
        os.path.abspath(os.path.expanduser(spec.pki_dir)) if spec.pki_dir else None, _rollout(spec),
        program.signer_inputs(spec.signer),
        secrets.get(stack_config.CA_KEY) if spec.signer is not None and spec.signer.kind == KIND_CA_KEY else None,
        secrets.get(stack_config.CA_PASSPHRASE_KEY))
    args = program.node_args(registration, n)
    replaced = {"host": parsed.outputs.get("address"), "host_key": parsed.outputs.get("hostKey")}
    # The spec types are typed for known values; in Args any of them may be a pulumi Output (as in node.Node).
    connection = dataclasses.replace(args.connection, **{k: v for k, v in replaced.items() if v is not None})  # type: ignore[arg-type]
    return dataclasses.replace(args, connection=connection)


class Prepared(dict[str, Any]):
    """A component's inputs as given, with what ``prepare`` made of them: the node's Python NodeArgs."""

    def __init__(self, inputs: Mapping[str, Any], parsed: Parsed, args: NodeArgs) -> None:
        super().__init__(inputs)
        self.parsed, self.args = parsed, args


def prepare(name: str, inputs: Mapping[str, Any]) -> Prepared:
    """The inputs checked as stack config and made the node's NodeArgs (the release approved, the key found).

    Every problem is raised as InputPropertiesError, the list the operator reads, before anything is registered.
    """
    parsed = parse(name, inputs)
    try:
        return Prepared(inputs, parsed, node_args(parsed))
    except LlmgwError as exc:  # a release that is not the operator's, an unreadable key...
        raise InputPropertiesError(f"llmgw Node {name}: {exc}", []) from None


class Node(pulumi.ComponentResource):
    """One GPU node onboarded into an llmgw cluster: ClientCertificate -> NodeIdentity -> AgentInstall ->
    EngineCheck. Its inputs are the node's settings as the stack config gives them (README, "Running it against
    real machines"); pass the VM it runs on as dependsOn and replaceWith, so re-imaging the VM re-onboards it."""

    hostname: pulumi.Output[str]
    """The node's hostname, as read on it."""
    host_key: pulumi.Output[str]
    """The SSH host key trusted for the node ('TYPE BASE64')."""
    certificate_not_after: pulumi.Output[str]
    """When the node's client certificate expires (ISO 8601, UTC)."""
    agent_version: pulumi.Output[str]
    """The llmgw agent version installed on the node."""
    problems: pulumi.Output[list[dict[str, str]]]
    """Engine and hardware problems found on the node, each with its problem and hint (and engine or HCA)."""
    inventory: pulumi.Output[dict[str, Any]]
    """What the node has: gpus [{index, name, memory_mib, uuid, pci_bus_id, compute_cap}], driver, cuda, hcas."""

    def __init__(self, name: str, args: Mapping[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        prepared = args if isinstance(args, Prepared) else prepare(name, args)
        parsed = prepared.parsed
        opts = opts or pulumi.ResourceOptions()
        if not opts.providers:  # the node's shard, shared by every node of the deployment in it
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                providers={"pulumi-python": provider_for(parsed.node.node_id, run=_deployment())}))
        super().__init__(f"{PACKAGE_NAME}:index:Node", name, None, opts)
        parts = onboard(self, name, prepared.args, opts)
        check = parts.engine_check
        self.hostname = parts.identity.hostname
        self.host_key = parts.identity.host_key
        self.certificate_not_after = parts.certificate.not_after
        self.agent_version = parts.agent.version
        self.problems = check.problems.apply(lambda p: [{k: str(v) for k, v in i.items() if v is not None}
                                                        for i in p or []])
        self.inventory = check.inventory.apply(lambda inv: inv or {})
        self.register_outputs({"hostname": self.hostname, "hostKey": self.host_key,
                               "certificateNotAfter": self.certificate_not_after, "agentVersion": self.agent_version,
                               "problems": self.problems, "inventory": self.inventory})


def _deployment() -> tuple[Any, ...]:
    """What one deployment's constructs share (each construct call has an engine connection of its own)."""
    return (pulumi.get_organization(), pulumi.get_project(), pulumi.get_stack(), pulumi.runtime.is_dry_run())


Node.__init__.__annotations__["args"] = input_type()
