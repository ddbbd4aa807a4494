"""The stack outputs ``fleet`` and ``nodes`` (pure).

``fleet`` is for a person: a map of node id to one line, which the CLI
prints one node per line, in `pulumi up`'s Outputs as in `pulumi stack output
fleet` (a string of several lines it would print escaped, cut after three).
Each line says the node's hostname, when its certificate expires and the days
left, the agent version, the architecture, its GPUs (count and model), its
readiness (ready, degraded or not ready: llmgw_pulumi.health.readiness) and its open
problems (engine and hardware problems, as the node's EngineCheck reports
them); the fields are padded so that they line up from node to node.

``nodes`` is for programs: each node's data as one line of JSON (JSON Lines),
one output for the whole fleet that `pulumi up` shows in a few lines
(``read_nodes`` reads it back).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..health.readiness import readiness_of


@dataclass(frozen=True)
class FleetRow:
    """What the fleet table shows of one node, from its resources' outputs."""

    node_id: str
    hostname: str
    not_after: str
    """The certificate's expiry, ISO 8601 (ClientCertificate.not_after)."""
    version: str
    arch: str
    gpus: Sequence[Mapping[str, Any]] = ()
    """EngineCheck.inventory["gpus"]."""
    problems: Sequence[Mapping[str, Any]] = ()
    """EngineCheck.problems."""


def gpu_summary(gpus: Sequence[Mapping[str, Any]]) -> str:
    """``8x NVIDIA H200``; several models each with its count; ``-`` for none."""
    counts = Counter(str(g.get("name", "?")) for g in gpus)
    return ", ".join(f"{n}x {name}" for name, n in counts.items()) or "-"


def gpu_model(gpus: Sequence[Mapping[str, Any]]) -> str:
    """The GPUs' model ('NVIDIA H200'), several joined with ' + ', or '' for none."""
    return " + ".join(dict.fromkeys(str(g.get("name", "?")) for g in gpus))


def problem_label(problem: Mapping[str, Any]) -> str:
    """A few words for one problem: ``vllm not-executable``, ``mlx5_1 missing``, ``nvidia-smi fails``; a problem
    of the readiness verdict by what it is about and its check: ``GPU 3 row-remap-pending``,
    ``mlx5_1 port 1 ib-phys-state``."""
    if "check" in problem:
        return f"{str(problem.get('subject') or '?').split(' (')[0]} {problem['check']}"
    what = problem.get("engine") or problem.get("hca") or problem.get("gpu") or "?"
    return f"{what} {problem.get('status', 'problem')}"


def problem_summary(problems: Sequence[Mapping[str, Any]]) -> str:
    """``none``, or the count and a few words for each."""
    if not problems:
        return "none"
    return f"{len(problems)}: " + ", ".join(problem_label(p) for p in problems)


def expiry(not_after: str, now: dt.datetime) -> tuple[str, str]:
    """(the expiry as 'YYYY-MM-DD HH:MM UTC', the whole days left, negative once expired)."""
    try:
        when = dt.datetime.fromisoformat(not_after)
    except ValueError:
        return not_after or "?", "?"
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    when = when.astimezone(dt.UTC)
    days = (when - now).total_seconds() // 86400
    return when.strftime("%Y-%m-%d %H:%M UTC"), f"{int(days)}" if days >= 0 else f"expired ({int(days)})"


def fleet_lines(rows: Sequence[FleetRow], now: dt.datetime) -> dict[str, str]:
    """Node id -> its line, the fields padded to line up across ``rows``."""
    fields = []
    for r in rows:
        expires, days = expiry(r.not_after, now)
        fields.append((r.hostname or "?", f"cert {expires}", f"({days} days left)" if days.isdigit() else f"({days})",
                       f"agent {r.version or '?'}", r.arch or "?", gpu_summary(r.gpus), readiness_of(r.problems),
                       f"problems: {problem_summary(r.problems)}"))
    widths = [max((len(f[i]) for f in fields), default=0) for i in range(7)]
    return {r.node_id: "  ".join([*(c.ljust(w) for c, w in zip(f, widths, strict=False)), f[-1]])
            for r, f in zip(rows, fields, strict=True)}


def nodes_lines(nodes: Mapping[str, Mapping[str, Any]]) -> str:
    """The ``nodes`` output: one line of JSON per node, ``{"node": id, ...its outputs}``, in the order given."""
    return "\n".join(json.dumps({"node": node, **data}, separators=(",", ":"), sort_keys=False)
                     for node, data in nodes.items())


def read_nodes(text: str) -> dict[str, dict[str, Any]]:
    """The ``nodes`` output read back: node id -> its outputs (``pulumi stack output nodes``; a program reading the
    stack through a StackReference gets the same text)."""
    found = {}
    for line in text.splitlines():
        if line.strip():
            data = json.loads(line)
            found[data.pop("node")] = data
    return found
