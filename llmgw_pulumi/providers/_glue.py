"""What all four providers share: check from a spec, diff by declared keys, outputs = inputs + computed.

Pulumi facts this encodes (see docs/pulumi-dynamic-providers.md):
- diff, update, read and delete receive the old *outputs*, so create and update
  return every input too;
- numbers arrive as floats, so values are normalised before comparing;
- ``__provider`` is never a reason to change anything;
- check and diff must not touch the network; they only compare values;
- a CheckFailure with a property name makes the engine print the value, which
  may be secret, so every failure is reported under the empty property with the
  field named in the reason.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Mapping, TypeVar

from pulumi.dynamic import CheckFailure, CheckResult, DiffResult

from ..errors import LlmgwError
from ..specs import Problems, is_unknown

F = TypeVar("F", bound=Callable[..., Any])

PROVIDER_KEY = "__provider"
CONNECTION_REPLACE_KEYS = ("host", "port")
"""A different address or port is a different machine: its resources are replaced, not updated."""


def normalise(value: Any) -> Any:
    """Make engine values comparable: 22.0 == 22, tuples == lists, None == missing."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: normalise(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    return value


def check(news: Mapping[str, Any], collect: Callable[[Mapping[str, Any], Problems], None],
          defaults: Mapping[str, Any] | None = None, derive: Callable[[dict[str, Any]], None] | None = None) -> CheckResult:
    """Validate ``news``; fill defaults so state shows what is in effect; add derived inputs."""
    node = news.get("node_id")
    problems = Problems(node if isinstance(node, str) else "?")
    collect(news, problems)
    failures = [CheckFailure("", f"{problems.node}: {name}: {problem}. Fix: {fix}") for name, problem, fix in problems]
    inputs = {**(defaults or {}), **{k: v for k, v in news.items() if v is not None}}
    if not failures and derive is not None:
        derive(inputs)
    return CheckResult(inputs, failures)


def changed_keys(olds: Mapping[str, Any], news: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """Input keys whose value differs; a nested ``connection`` is compared field by field."""
    changed = []
    for key in keys:
        old, new = olds.get(key), news.get(key)
        if key == "connection" and isinstance(old, Mapping) and isinstance(new, Mapping):
            for sub in sorted(set(old) | set(new)):
                if sub == "host_key" and new.get(sub) is None:
                    continue  # an unpinned key is recorded in outputs, not compared
                if is_unknown(new.get(sub)) or normalise(old.get(sub)) != normalise(new.get(sub)):
                    changed.append(f"connection.{sub}")
        elif is_unknown(new) or normalise(old) != normalise(new):
            changed.append(key)
    return changed


def diff_result(changes: list[str], replace_keys: Iterable[str], delete_before_replace: bool = False) -> DiffResult:
    replace = set(replace_keys)
    replaces = [c for c in changes if c in replace or c.split(".")[0] in replace]
    return DiffResult(
        changes=bool(changes),
        replaces=replaces,
        delete_before_replace=delete_before_replace if replaces else None,
    )


def outputs(props: Mapping[str, Any], **computed: Any) -> dict[str, Any]:
    """Outputs are all inputs plus what the operation found out (None values dropped)."""
    return {**{k: v for k, v in props.items() if v is not None}, **{k: v for k, v in computed.items() if v is not None}}


def node_of(props: Mapping[str, Any]) -> str:
    node = props.get("node_id")
    return node if isinstance(node, str) else "?"


def operator_errors(fn: F) -> F:
    """Raise the package's errors with a one-frame traceback.

    The engine shows a provider's whole traceback; for an error that already
    says what happened and what to do, the frames inside the package are noise.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LlmgwError as exc:
            raise exc.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]
