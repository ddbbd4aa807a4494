"""The component's input types, made from the package's own declarations (for llmgw_pulumi.stack.component).

``declared_settings`` is the one adapter from the package's declarations to
the inputs of the ``Node`` component: the stack config's schema
(llmgw_pulumi.config.stack_config) gives the keys and their nesting, the spec tables
(llmgw_pulumi.config.specs, llmgw_pulumi.config.agent_settings) each key's type and doc.
``input_type`` turns them into the TypedDict the component analyzer reads, and
``schema_descriptions`` puts their docs into the package schema (the analyzer
reads docs from source, which types made here do not have).

Pure: nothing here talks to the engine or checks a value; llmgw_pulumi.stack.component
checks the inputs and builds the node.
"""

import ast
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, Required, TypedDict

import pulumi

from ..config import stack_config
from ..config.agent_settings import FABRIC_SCHEMA, AgentSettings, BinarySource, Fabric
from ..config.registration import RegistrationCheck
from ..config.schema import REQUIRED, settings_of
from ..config.signer import SignerSpec
from ..config.specs import CertificateSpec, Connection, EngineCheckSpec, Rollout

OUTPUT_CAPABLE = ("address", "hostKey", "servers")
"""The inputs (besides the secrets) that may be another resource's outputs: what a VM's create tells (its address
and host key), and the control plane's servers (another stack's or resource's addresses). Each is checked by the
resource it reaches, once it is known."""

SETTLED = ("agent", "ssh")
"""The inputs that may be other resources' outputs but are needed when the node is constructed (the release is
approved and the SSH key found before anything is registered): accepted once known, as they are at `up` and in a
preview when they come from config, another stack or a resource that exists; a preview in which one is not known
yet (an output of a resource the same deployment creates) refuses it by name (``component.parse``)."""

SETTLED_DOC = (" May be an output of another resource: it is read once known (always at `up`); in a preview, an output"
               " not known yet (of a resource this deployment creates) is refused, as the release is approved and the"
               " SSH key found before the node is registered.")
"""What the component schema's descriptions of the SETTLED inputs add (``schema_descriptions``)."""

SECRETS = {stack_config.SECRET_KEY: "private_key", stack_config.PASSPHRASE_KEY: "passphrase",
           stack_config.CA_PASSPHRASE_KEY: "ca_key_passphrase", stack_config.CA_KEY: "ca_key"}
"""The secret settings, which the stack config reads with ``--secret``: here, inputs (made secret)."""

RENAMED = {"id": "nodeId"}
"""Stack-config keys the component spells otherwise: the SDKs take ``id`` for the resource's own (and drop it)."""



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
    default: Any = None
    """Its default (None: none, or the setting is not given); ``schema.REQUIRED`` when it must be given."""


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
    default = _default(f) if f is not None else None
    nested = f.metadata.get("nested") if f is not None else None
    plain = _plain(tp)
    item = typing.get_args(plain)[0] if typing.get_origin(plain) is list else None
    if nested is not None or dataclasses.is_dataclass(plain):
        cls = typing.cast(type, nested or plain)
        return Declared(key, None, doc, _from_class(cls, sub or _keys_of(cls), f"{path}{key}."), name=cls.__name__,
                        default=None if dataclasses.is_dataclass(default) else default)
    if item is not None and dataclasses.is_dataclass(item):
        item = typing.cast(type, item)
        item_schema = sub[0] if isinstance(sub, list) else _keys_of(item)
        return Declared(key, None, doc, _from_class(item, item_schema, f"{path}{key}[]."), many=True, name=item.__name__)
    if isinstance(sub, Mapping):  # a mapping declared by its schema only (engines): its leaves are text (paths)
        return _from_schema(key, sub, doc, path)
    return Declared(key, plain, doc, default=default)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def _keys_of(cls: type) -> dict[str, None]:
    return {f.metadata["config"]: None for f in settings_of(cls) if f.metadata["config"]} or \
        dict.fromkeys(typing.get_type_hints(cls))


_LEAF_DOC = "An absolute path on the node."
"""A mapping declared by its schema only is the engines: a mapping per engine, of paths on the node."""


def _from_schema(key: str, schema: Mapping[str, Any], doc: str, path: str) -> Declared:
    children = tuple(_from_schema(k, sub, f"The {k} engine on the node.", f"{path}{key}.") if isinstance(sub, Mapping)
                     else Declared(k, str, _LEAF_DOC)
                     for k, sub in schema.items())
    return Declared(key, None, doc, children, name=_pascal(f"{path}{key}"))


def declared_settings() -> tuple[Declared, ...]:
    """Every setting of one node as the stack config declares it: the node's own, then the stack-wide ones.

    The one adapter from the package's declarations to the component's inputs:
    the stack config's schema (stack_config.SCHEMA, NODE_SCHEMA) gives the keys
    and their nesting, the spec tables (llmgw_pulumi.config.specs) each key's type and
    doc. A key the schema has and no spec declares is an error here, so the two
    cannot drift apart unseen.
    """
    node_classes = (CertificateSpec, Connection, AgentSettings, EngineCheckSpec)
    node_schema = {k: v for k, v in stack_config.NODE_SCHEMA.items() if k not in ("agent", "fabric")}
    declared = list(_from_class(Connection, node_schema, "", node_classes))
    fabric = _setting(AgentSettings, "fabrics", "fabric", Fabric, FABRIC_SCHEMA, "")
    declared.append(dataclasses.replace(fabric, doc="One fabric (instead of fabrics): " + fabric.doc))
    top = {k: v for k, v in stack_config.SCHEMA.items() if k not in {*stack_config.NODE_SCHEMA, "nodes", "inventory", *SECRETS}}
    sections = {"agent": BinarySource, "ssh": Connection, "certificate": CertificateSpec, "rollout": Rollout,
                "registration": RegistrationCheck}
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
            declared.append(Declared(key, None, _class_doc(SignerSpec), _from_class(SignerSpec, sub, f"{key}."),
                                     name="Signer"))
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
                       inputs=(*OUTPUT_CAPABLE, *SETTLED, *SECRETS))


def schema_descriptions(schema: dict[str, Any], nodejs_package: str, go_import_path: str) -> dict[str, Any]:
    """The package schema with each input property documented from its declaration (the analyzer reads
    docs from source, which generated types do not have), the secret settings (``SECRETS``) marked
    ``secret`` (the analyzer has no way to say so, and an SDK then keeps them secret wherever they are given),
    how the SETTLED inputs take an output (``SETTLED_DOC``), and the SDKs' own names: the npm package and the
    Go import path."""
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

    language = schema.setdefault("language", {})
    language.setdefault("nodejs", {})["packageName"] = nodejs_package
    language.setdefault("go", {})["importBasePath"] = go_import_path
    for resource in schema.get("resources", {}).values():
        inputs = resource.get("inputProperties", {})
        walk(inputs, declared_settings())
        for key in SECRETS:
            if key in inputs:
                inputs[key]["secret"] = True
        for key in SETTLED:  # the component's own terms: how an output is taken (not the stack config's page)
            if key in inputs:
                inputs[key]["description"] = inputs[key].get("description", "") + SETTLED_DOC
    return schema


# --------------------------------------------------------------------------- the component's outputs
# Spelled in camelCase here: the SDKs' own spelling, which the component provider passes through unchanged for
# the items of a list (it maps only the first level of an output's names).


class Gpu(TypedDict):
    """One GPU, as nvidia-smi reports it on the node."""

    index: int
    """Its index, as `nvidia-smi -i` takes it."""
    name: str
    """Its product name (NVIDIA H200)."""
    memoryMib: int
    """Its memory, in MiB."""
    uuid: str
    """Its UUID (GPU-...)."""
    pciBusId: str
    """Its PCI bus id (00000000:18:00.0)."""
    computeCap: str
    """Its compute capability (9.0)."""


class Inventory(TypedDict):
    """What the node has, as read on it when it was onboarded or last refreshed."""

    gpus: list[Gpu]
    """Its GPUs; empty on a node without any (or without nvidia-smi)."""
    driver: str
    """The NVIDIA driver's version; empty without GPUs."""
    cuda: str
    """The CUDA version the driver supports; empty without GPUs."""
    hcas: list[str]
    """Its InfiniBand HCAs (mlx5_0, ...)."""


def inventory_output(inventory: Mapping[str, Any] | None) -> Inventory:
    """EngineCheck's ``inventory`` output (snake_case, llmgw_pulumi.nodestate.facts) as the component's ``Inventory``."""
    given = inventory or {}
    gpus = [typing.cast(Gpu, {key: gpu.get(_snake(key)) for key in Gpu.__annotations__})
            for gpu in given.get("gpus") or []]
    return Inventory(gpus=gpus, driver=str(given.get("driver") or ""), cuda=str(given.get("cuda") or ""),
                     hcas=[str(h) for h in given.get("hcas") or []])

