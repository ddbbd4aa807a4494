"""Where the pure core meets the Pulumi SDK: a spec becomes a resource's inputs, a ConfigError a pulumi.RunError.

The modules that decide what a node should hold and what a change does import no SDK
(tests/unit/test_layering.py); what needs the SDK's types to hand their results to the engine is here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

import pulumi
from pulumi.output import Output

from .errors import ConfigError


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



# --------------------------------------------------------------------------- errors


@contextlib.contextmanager
def pulumi_errors() -> Iterator[None]:
    """Around an entry point the SDK calls (the program's ``run``, ``Node``, a provider's operation): a
    ConfigError raised inside leaves it as a ``pulumi.RunError`` too (``as_pulumi_error``)."""
    try:
        yield
    except ConfigError as exc:
        raise as_pulumi_error(exc) from None


def as_pulumi_error(exc: ConfigError) -> ConfigError:
    """The same error, of a class that is both its own and a ``pulumi.RunError``: the Python language host prints
    a RunError's message alone, as an error, with no traceback (there is nothing in the program's frames for an
    operator to fix), and a program that catches the error's own class still catches it."""
    if isinstance(exc, pulumi.RunError):
        return exc
    shown = _run_error_class(type(exc))
    converted = shown.__new__(shown)
    converted.__dict__.update(vars(exc))
    converted.args = exc.args
    return converted


_RUN_ERRORS: dict[type[ConfigError], type[ConfigError]] = {}


def _run_error_class(cls: type[ConfigError]) -> type[ConfigError]:
    """``cls`` and ``pulumi.RunError`` at once; named as ``cls``, so a traceback or a log line names the error as
    it did when ConfigError itself was a RunError."""
    if cls not in _RUN_ERRORS:
        _RUN_ERRORS[cls] = type(cls.__name__, (cls, pulumi.RunError),
                                {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _RUN_ERRORS[cls]
