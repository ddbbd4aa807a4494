"""Where the pure core meets the Pulumi SDK: a spec becomes a resource's inputs here.

The modules that decide what a node should hold and what a change does import no SDK
(tests/unit/test_layering.py); what needs the SDK's types to hand their results to the engine is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pulumi.output import Output


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
