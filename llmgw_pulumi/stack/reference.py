"""The configuration reference (docs/configuration.md), made from the settings' declarations.

Every key, its type, default and meaning come from where the setting is declared
(``schema.setting(doc=...)`` in the spec tables, read through
``component_types.declared_settings``, the same adapter the component's schema
is made from), so the reference cannot drift from what the code accepts. A unit
test regenerates the page and compares.

    python -m llmgw_pulumi.stack.reference > docs/configuration.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence

from ..config import stack_config
from ..config.schema import REQUIRED
from . import component_types
from .component_types import Declared

HEADER = """\
# Configuration reference

Every setting of the stack config (`stacks/Pulumi.<stack>.yaml`), under the
`llmgw` namespace. Set one with `pulumi config set --path`, for example
`pulumi config set --path 'llmgw:ssh.user' deploy`; a secret with
`pulumi config set --secret`. A program of its own passes the same settings
to the `Node` component, spelled the same (`id` is `nodeId` there).

This page is generated from the settings' declarations in the code
(`python -m llmgw_pulumi.stack.reference > docs/configuration.md`); a test
fails when it differs, so it says exactly what the code accepts. What each
value may hold is checked before anything runs, and a wrong one is named with
its fix: see [What the config may hold](operations.md#what-the-config-may-hold).
"""


def _type(d: Declared) -> str:
    if d.children or d.many:
        return "list of mappings" if d.many else "mapping"
    names = {str: "text", float: "number", int: "whole number", bool: "true or false"}
    tp = d.type
    if getattr(tp, "__origin__", None) is list:
        return f"list of {names.get(tp.__args__[0], 'text')}"
    if getattr(tp, "__origin__", None) is dict:
        return f"mapping of {names.get(tp.__args__[1], 'text')}"
    return names.get(tp, "text")


def _default(d: Declared) -> str:
    if d.default == REQUIRED:
        return "required"
    if d.default in (None, (), [], {}, ""):
        return ""
    value = list(d.default) if isinstance(d.default, tuple) else d.default
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


SPELLED = {component: key for key, component in component_types.RENAMED.items()}
"""The stack config's own spelling of a key the component spells otherwise (``nodeId``: ``id``)."""


def _rows(settings: Sequence[Declared], prefix: str = "") -> Iterator[tuple[str, Declared]]:
    for d in settings:
        yield prefix + (SPELLED.get(d.key, d.key) if not prefix else d.key), d
        yield from _rows(d.children, f"{prefix}{d.key}{'[]' if d.many else ''}.")


def _table(settings: Sequence[Declared], also: frozenset[str] = frozenset()) -> list[str]:
    lines = ["| key | type | default | what it means |", "|---|---|---|---|"]
    for path, d in _rows(settings):
        note = " Also a node's own setting." if path in also else ""
        lines.append(f"| `{path}` | {_type(d)} | {_default(d)} | {_cell(d.doc)}{note} |")
    return lines


def _module_doc(name: str) -> str:
    return component_types._module_docs(stack_config).get(name, "")


def render() -> str:
    """The page, as docs/configuration.md holds it."""
    declared = {d.key: d for d in component_types.declared_settings()}
    node_keys = {component_types.RENAMED.get(k, k) for k in stack_config.NODE_SCHEMA}
    secrets = set(component_types.SECRETS)
    node = [d for key, d in declared.items() if key in node_keys]
    stack = [d for key, d in declared.items()
             if key not in secrets and (key not in node_keys or key in stack_config.SCHEMA)]
    nodes = Declared(stack_config.NODES_KEY, None, _module_doc("NODES_KEY"), many=True)
    inventory = Declared(stack_config.INVENTORY_KEY, str, _module_doc("INVENTORY_KEY"))
    out = [HEADER, "## The stack", "",
           "`llmgw:<key>`. A key marked as a node's own setting is the stack's default, which a node may change.", ""]
    out += _table([nodes, inventory, *stack], also=frozenset(d.key for d in stack if d.key in node_keys))
    out += ["", "## A node", "",
            "One entry of `llmgw:nodes`, or one row of the node list file `llmgw:inventory` names (a CSV file's "
            "columns are these keys, nested ones dotted: `engines.vllm.bin`).", ""]
    out += _table(node)
    out += ["", "## Secrets", "",
            "Each is read only as a secret (`pulumi config set --secret llmgw:<key>`); given in plain text it is "
            "refused, and no other setting is read as a secret.", ""]
    out += _table([declared[key] for key in component_types.SECRETS])
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
