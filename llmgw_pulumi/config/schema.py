"""The one schema of settings: each setting declared once, and everything that reads it.

Pulumi delivers a resource's inputs as JSON-like dicts: numbers arrive as
floats, absent or ``None`` values arrive as missing keys, and during preview
any value may be an ``Unknown``. The stack config (stacks/Pulumi.<stack>.yaml)
says the same things in camelCase. A spec (llmgw_pulumi.config.specs,
llmgw_pulumi.config.agent_settings) is a frozen dataclass whose fields are the table
of its settings, each declared once with ``setting(...)``:

- the field's name is its input name (the key kept in state), and its
  annotation its type;
- ``config``: its stack-config key (None: not in the stack config);
- ``check``/``collect``: its validator; ``nested``: a spec of sub-settings;
- the field's default (without one, the setting is required);
- ``replaces``: a different value is a different machine, so the resource is
  replaced (``replace_keys``);
- ``agent_yaml``: its key in agent.yaml (``agent_yaml_entries`` renders them),
  and ``agent_default`` the agent's own default, never written;
- ``doc``: what it means, for the schema other languages are generated from.

What reads the table: the provider's ``check`` (``collect_fields`` with
``Problems(node)``), the stack-config reader (the same collectors, with
``Problems(node, Spelling.STACK_CONFIG)``: a bad value has the same problem and
fix in both, each under its own name for the field; a value of the wrong type has the same problem, and a fix
in the reader's own terms, ``Problems.wrong_type``), ``config_schema`` (every
stack-config key), ``build`` (typed values from inputs; ``boundary.to_inputs`` the way back),
``defaults``, ``replace_keys``, ``agent_yaml_entries`` and ``describe``.

Collecting problems never fails on an unknown value: a value that is not known
yet is checked when it is.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Self, cast

import yaml

from .. import validate
from ..errors import ConfigError


def is_unknown(value: object) -> bool:
    """True for a value (or a container holding a value) that Pulumi does not know yet.

    The SDK's ``Unknown`` is looked up among the loaded modules, not imported: no value of it can exist before the
    SDK is loaded, and the schema imports no SDK (tests/unit/test_layering.py)."""
    sdk = sys.modules.get("pulumi.output")
    return sdk is not None and _holds(value, sdk.Unknown)


def _holds(value: object, unknown: type) -> bool:
    if isinstance(value, unknown):
        return True
    if isinstance(value, Mapping):
        return any(_holds(v, unknown) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds(v, unknown) for v in value)
    return False


def normalise(value: Any) -> Any:
    """Make input values comparable as Pulumi delivers them: 22.0 == 22, tuples == lists, None == missing (the
    providers' diff and the review of a preview compare values through it)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: normalise(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    return value


class Spelling(enum.Enum):
    """How the settings being read are named: as a resource's inputs (``mgmt_addr``), or as in the stack config
    (``mgmtAddr``). A reader says it once, in its ``Problems``; every collector names fields by it."""

    INPUTS = "inputs"
    STACK_CONFIG = "stack config"


def kind_of(value: object) -> str:
    """What a value is, as an operator reads it in a message: "a string ('cp1:7443')", "a list", "a mapping"."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (true or false)"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"a string ({shown!r})" if value else "an empty string"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "empty"
    return f"a {type(value).__name__}"


def _leaves(example: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path below the setting, value) of each single value of ``example``: '[0]', '[0].id', '.user'."""
    if isinstance(example, Mapping):
        for k, v in example.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(example, (list, tuple)):
        for i, v in enumerate(example):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, example


def flow_yaml(example: Any) -> str:
    """``example`` as YAML on one line: [cp1:7443], {id: gpu-01, address: 10.0.0.11}."""
    text = str(yaml.safe_dump(example, default_flow_style=True, sort_keys=False, width=10_000))
    return text.removesuffix("\n...\n").strip()  # a single value ends its document with '...'


@dataclass
class Problems:
    """Collects (field, problem, fix) triples for one node, read in one spelling; unknown values are skipped."""

    node: str
    spelling: Spelling = Spelling.INPUTS
    items: list[tuple[str, str, str]] = field(default_factory=list)
    config_key: str | None = None
    """How `pulumi config set --path` names what is read, up to where a field's name follows: 'llmgw:' for the
    stack's settings, 'llmgw:nodes[2].' for a node's; None when the values are not in the stack's config (a node
    list file, a resource's inputs)."""

    @property
    def in_stack_config(self) -> bool:
        return self.spelling is Spelling.STACK_CONFIG

    def check(self, name: str, value: object, validator: Callable[[Any], validate.Problem]) -> None:
        if is_unknown(value):
            return
        bad = validator(value)
        if bad:
            self.items.append((name, *bad))

    def add(self, name: str, problem: str, fix: str) -> None:
        self.items.append((name, problem, fix))

    def wrong_type(self, name: str, value: object, wants: str, example: Any) -> None:
        """``name`` is ``value``, which is not what it must be (``wants``: 'a list of host:port'): say what it is,
        and how to write it as ``example`` (a string given for a list of strings: its own words, listed)."""
        if is_unknown(value):
            return
        if isinstance(value, str) and value.strip() and isinstance(example, list) and example \
                and all(isinstance(e, str) for e in example):
            example = re.split(r"[\s,]+", value.strip())
        self.add(name, f"is {kind_of(value)}, not {wants}", self.how_to_write(name, example))

    def how_to_write(self, name: str, example: Any) -> str:
        """The fix that gives ``name`` the value ``example``: `pulumi config` commands for the stack's config, a YAML
        line for a node list file, a Python value for inputs."""
        if self.spelling is Spelling.INPUTS:
            return f"pass it as {example!r}"
        leaf = re.split(r"[.\]]", name)[-1] or name
        if self.config_key is None:
            return f"write it as {leaf}: {flow_yaml(example)}"
        key = self.config_key + name
        if key.endswith("]"):  # a list's item: `pulumi config` can neither retype it nor remove it in place
            return f"in the stack's settings file, write {key} as {flow_yaml(example)}"
        sets = [f"`pulumi config set --path {shlex.quote(key + below)} {shlex.quote(str(v))}`"
                for below, v in _leaves(example)]
        nested = any(c in key.partition(":")[2] for c in ".[")
        first = f"`pulumi config rm --path {shlex.quote(key)}`, then " if nested else ""
        return f"{first}{', '.join(sets)} (in the stack's file: {leaf}: {flow_yaml(example)})"

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


def key_shown(key: object) -> str:
    """A key as a field's name in a message: as written, or quoted when it is empty, not text or not printable."""
    return key if isinstance(key, str) and key and key.isprintable() and key.strip() == key else repr(key)


# --------------------------------------------------------------------------- declaring a setting

Collect = Callable[[Any, Problems, str], None]
"""(value, problems, where): report what is wrong with a given value under the name ``where``
(``problems.spelling`` says how its sub-settings are named)."""
Schema = Mapping[str, Any]
"""A setting's sub-settings by stack-config key: None for a value, a mapping for nested settings, [mapping] for a list of them."""
Render = Callable[[Any], Mapping[str, object]]
"""A setting's value -> its entries in agent.yaml (most settings: one entry under their key)."""


def setting(config: str | None, check: Callable[[Any], validate.Problem] | None = None, *,
            collect: Collect | None = None, nested: type | None = None, convert: Callable[[Any], Any] | None = None,
            to_input: Callable[[Any], Any] | None = None, schema: Any = None, secret: bool = False,
            replaces: bool = False, agent_yaml: str | None = None, render: Render | None = None,
            agent_default: Any = None, doc: str = "", **default: Any) -> Any:
    """A field of a spec: one setting, declared once. Its name is the input name; see the module's docstring.

    ``check`` validates one value, ``collect`` a structured one; ``nested`` is a spec of
    sub-settings. ``convert`` makes the typed value from the input (``to_input`` the reverse,
    where they differ). ``agent_yaml``: the key under which agent.yaml holds it (``render``: its
    entries there, when they are not one entry under that key); ``agent_default``: the agent's
    own default, never written as an override. ``default``/``default_factory`` as for
    ``dataclasses.field``; without them the setting is required.
    """
    if nested is not None:
        collect = collect or nested_settings(nested)
        convert = convert or (lambda value: build(nested, value))
        schema = schema or config_schema(nested)
    elif collect is None:
        assert check is not None
        collect = lambda value, problems, where: problems.check(where, value, check)  # noqa: E731
    metadata = {"config": config, "collect": collect, "convert": convert, "to_input": to_input, "schema": schema,
                "nested": nested, "secret": secret, "replaces": replaces, "agent_yaml": agent_yaml, "render": render,
                "agent_default": agent_default, "doc": doc}
    return field(metadata=metadata, **default)


def same_as(cls: type, name: str, **changed: Any) -> Any:
    """Another spec's setting ``name``, declared there once: the same validator, type conversion and doc, with
    ``changed`` metadata (e.g. ``config=None``: not a stack-config key of this spec)."""
    f = next(f for f in fields(cls) if f.name == name)
    default = {"default": f.default} if f.default is not MISSING else {"default_factory": f.default_factory}
    return field(metadata={**f.metadata, **changed}, **default)


def settings_of(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in fields(cls) if "collect" in f.metadata]


def names(cls: type, spelling: Spelling = Spelling.INPUTS) -> dict[str, str]:
    """Field name -> its key in the chosen spelling, for the settings that spelling has."""
    config = spelling is Spelling.STACK_CONFIG
    return {f.name: f.metadata["config"] if config else f.name for f in settings_of(cls)
            if not config or f.metadata["config"] is not None}


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def collect_fields(cls: type, props: Mapping[str, Any], problems: Problems, *, prefix: str = "",
                   only: Sequence[str] | None = None, partial: bool = False, spelling: Spelling | None = None) -> None:
    """Validate ``cls``'s settings in ``props``, naming each as ``problems`` spells them (or as ``spelling``).

    A setting that is absent is reported only when it is required, unless ``partial``
    (a node's settings fall back to the stack's). ``only``: these fields (by input name).
    """
    key = names(cls, spelling or problems.spelling)
    for f in settings_of(cls):
        if f.name not in key or only is not None and f.name not in only:
            continue
        value = props.get(key[f.name])
        if value is None and (partial or not _required(f)):
            continue
        f.metadata["collect"](value, problems, prefix + key[f.name])


def collect_one(cls: type, name: str, props: Mapping[str, Any], problems: Problems, prefix: str = "") -> None:
    """Validate one of ``cls``'s settings, whether given or not."""
    key = names(cls, problems.spelling)[name]
    collector = next(f for f in settings_of(cls) if f.name == name).metadata["collect"]
    collector(props.get(key), problems, prefix + key)


def nested_settings(cls: type, name: str | None = None) -> Collect:
    """The collector of a mapping of ``cls``'s settings: unknown keys with the nearest one, then each setting.
    ``name``: what a setting of it is called in messages (default: the class's name, lower case)."""
    called = name or cls.__name__.lower()
    what = f"a {called} setting"

    def collect(value: Any, problems: Problems, where: str) -> None:
        known = names(cls, problems.spelling).values()
        if not isinstance(value, Mapping):
            problems.wrong_type(where, value, f"a mapping of {called} settings", {k: "..." for k in list(known)[:1]})
            return
        for k in value:
            if k not in known:
                problems.add(f"{where}.{key_shown(k)}", f"is not {what}", validate.did_you_mean(str(k), known))
        collect_fields(cls, value, problems, prefix=f"{where}.")

    return collect


# --------------------------------------------------------------------------- reading the declarations


def build(cls: type, props: Mapping[str, Any], **given: Any) -> Any:
    """``cls`` from validated inputs (input names); absent values take the field's default. A value not known
    yet is kept as it is: it is converted (and checked) by the resource it reaches, once it is known."""
    kwargs = {}
    for f in settings_of(cls):
        value = props.get(f.name)
        if value is not None:
            kwargs[f.name] = f.metadata["convert"](value) if f.metadata["convert"] and not is_unknown(value) else value
    return cls(**{**kwargs, **given})


def renamed(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``cls``'s settings among stack-config ``values``, under their input names (nested ones too)."""
    out = {}
    for name, key in names(cls, Spelling.STACK_CONFIG).items():
        if key in values:
            nested = next(f for f in fields(cls) if f.name == name).metadata["nested"]
            out[name] = renamed(nested, values[key]) if nested and isinstance(values[key], Mapping) else values[key]
    return out


def config_schema(cls: type, only: Sequence[str] | None = None) -> dict[str, Any]:
    """``cls``'s stack-config keys and their sub-settings."""
    return {f.metadata["config"]: f.metadata["schema"] for f in settings_of(cls)
            if f.metadata["config"] is not None and (only is None or f.name in only)}


def defaults(cls: type, only: Sequence[str]) -> dict[str, Any]:
    """The declared defaults of ``cls``'s settings ``only``, by input name: what a provider's check fills in,
    so that state shows what is in effect."""
    out = {f.name: f.default for f in settings_of(cls) if f.name in only and f.default is not MISSING}
    assert set(out) == set(only), f"{cls.__name__} declares no default for {set(only) - set(out)}"
    return out


def replace_keys(cls: type, prefix: str = "") -> tuple[str, ...]:
    """The inputs of ``cls`` (dotted into nested specs) whose change replaces the resource: ``replaces=True``."""
    keys: list[str] = []
    for f in settings_of(cls):
        if f.metadata["replaces"]:
            keys.append(prefix + f.name)
        elif f.metadata["nested"] is not None:
            keys += replace_keys(f.metadata["nested"], f"{prefix}{f.name}.")
    return tuple(keys)


def _absent(value: object) -> bool:
    return value is None or isinstance(value, (str, list, tuple, Mapping)) and not value


def agent_yaml_entries(spec: object) -> dict[str, object]:
    """What the settings of ``spec`` (a dataclass instance) write in agent.yaml, in their declared order: each
    setting with an ``agent_yaml`` key whose value is given and differs from the agent's own default."""
    out: dict[str, object] = {}
    for f in settings_of(type(spec)):
        key, value = f.metadata["agent_yaml"], getattr(spec, f.name)
        if key is None or _absent(value) or value == f.metadata["agent_default"]:
            continue
        if f.metadata["render"] is not None:
            out.update(f.metadata["render"](value))
        elif f.metadata["nested"] is not None:
            if entries := agent_yaml_entries(value):
                out[key] = entries
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------- introspection


@dataclass(frozen=True)
class SettingInfo:
    """One setting as ``describe`` lists it: the stable, documented shape a schema for other languages is made
    from (docs/operations.md, "The settings' schema"). New fields may be added; none is renamed or removed."""

    path: tuple[str, ...]
    """Where it is, by input names: ('settings', 'discovery', 'nvidia_smi'); its name is the last."""
    config_key: str | None
    """Its stack-config key at its place (``nvidiaSmi``), or None when the stack config has no such key."""
    type: str
    """Its Python annotation as written (``str | None``, ``Sequence[Fabric]``)."""
    default: Any
    """Its default; ``REQUIRED`` when it has none."""
    doc: str
    nested: bool
    """A spec of sub-settings: they follow it, their path below its own."""
    secret: bool
    replaces: bool
    agent_yaml: str | None
    """Its key in agent.yaml, or None when agent.yaml does not hold it."""

    @property
    def name(self) -> str:
        return self.path[-1]


REQUIRED = "<required>"
"""``SettingInfo.default`` of a setting that has no default."""


def describe(cls: type, path: tuple[str, ...] = ()) -> list[SettingInfo]:
    """Every setting of spec ``cls``, depth first, each nested spec before its sub-settings."""
    out: list[SettingInfo] = []
    for f in settings_of(cls):
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        nested = f.metadata["nested"]
        out.append(SettingInfo(path=(*path, f.name), config_key=f.metadata["config"], type=str(f.type),
                               default=default, doc=f.metadata["doc"], nested=nested is not None,
                               secret=f.metadata["secret"], replaces=f.metadata["replaces"],
                               agent_yaml=f.metadata["agent_yaml"]))
        if nested is not None:
            out += describe(nested, (*path, f.name))
    return out


def declared_in(spec: type, name: str | None = None, *, config: str | None = None, **default: Any) -> Any:
    """A field of an Args class that is ``spec``'s setting ``name``, declared there (None: all of ``spec``'s
    settings, nested under this field, whose stack-config mapping is ``config``, when it has one)."""
    return field(metadata={"declared_in": (spec, name, config)}, **default)


def describe_args(cls: type) -> list[SettingInfo]:
    """Every setting of the Args dataclass ``cls``, as ``describe`` lists a spec's: each field's declaration is
    where ``declared_in`` points (a field without one says its own ``doc`` and ``secret`` in its metadata)."""
    out: list[SettingInfo] = []
    for f in fields(cls):
        spec, name, config = f.metadata.get("declared_in", (None, None, None))
        if spec is None:
            out.append(SettingInfo(path=(f.name,), config_key=None, type=str(f.type), default=f.default,
                                   doc=f.metadata.get("doc", ""), nested=False, secret=f.metadata.get("secret", False),
                                   replaces=False, agent_yaml=None))
        elif name is None:
            doc = (spec.__doc__ or "").strip().split("\n")[0]
            out.append(SettingInfo(path=(f.name,), config_key=config, type=spec.__name__,
                                   default=REQUIRED if _required(f) else f.default, doc=doc, nested=True,
                                   secret=False, replaces=False, agent_yaml=None))
            out += describe(spec, (f.name,))
        else:  # the setting, and its sub-settings when it nests others
            out += [dataclasses.replace(info, path=(f.name, *info.path[1:])) for info in describe(spec)
                    if info.path[0] == name]
    return out


class FromProps:
    """``from_props``: a spec from a resource's inputs, once its own ``collect`` found nothing wrong."""

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        raise NotImplementedError

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> Self:
        raise_problems(cls.collect, props)
        return cast(Self, build(cls, props))


def __getattr__(name: str) -> Any:
    # ``to_inputs`` makes the SDK's Outputs: it moved to llmgw_pulumi.boundary, and is still importable from here.
    if name == "to_inputs":
        from ..boundary import to_inputs

        return to_inputs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
