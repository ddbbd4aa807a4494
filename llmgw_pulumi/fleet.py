"""The stack output ``fleet``: one line per node, for a person reading `pulumi stack output fleet` (pure).

The CLI prints a string output as it is, so the table is one multi-line
string: per node its hostname, when its certificate expires and the days left,
the agent version, the architecture, its GPUs (count and model), its readiness
(ready, degraded or not ready: llmgw_pulumi.readiness) and its open problems
(engine and hardware problems, as the node's EngineCheck reports them).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .readiness import readiness_of

HEADER = ("NODE", "HOSTNAME", "CERT EXPIRES", "DAYS LEFT", "AGENT", "ARCH", "GPUS", "READY", "PROBLEMS")


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


def fleet_table(rows: Sequence[FleetRow], now: dt.datetime) -> str:
    """The table, a header line and one line per node (in the order given), columns padded to align."""
    lines = [HEADER]
    for r in rows:
        expires, days = expiry(r.not_after, now)
        lines.append((r.node_id, r.hostname or "?", expires, days, r.version or "?", r.arch or "?",
                      gpu_summary(r.gpus), readiness_of(r.problems), problem_summary(r.problems)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)), line[-1]]) for line in lines)
