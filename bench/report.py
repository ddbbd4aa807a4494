"""The benchmark's tables: one line per run, the results, issue 6's ratios, where the time and the CPU went, the
state's make-up."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.backend import backend_kind
from bench.config import FLOOR, REMOTE_TYPES
from bench.measure import Counters, Result

# --------------------------------------------------------------------------- report


def one_line(r: Result) -> str:
    agents = f", agents up {r.agents_up:.1f}s" if r.agents_up is not None else ""
    state = (f", state {r.state.per_node:.0f} B/node ({r.state.per_node_no_pem:.0f} w/o PEM)"
             if r.state else "")
    written = f", {r.backend_bytes / 1e6:.2f} MB written to the backend" if r.backend_bytes is not None else ""
    ksmd = f", ksmd {r.cpu.ksmd:.1f}s" if r.cpu.ksmd else ""
    status = "" if r.ok else "  FAILED"
    note = f"  [{r.note}]" if r.note else ""
    return (f"N={r.size} {r.scenario}: {r.wall:.2f}s wall, {r.ssh} SSH, CPU {r.cpu.machine:.1f}s machine, "
            f"{r.cpu_own:.1f}s ours + hosts = {cpu_split(r.cpu)}{ksmd}{agents}{state}{written}{status}{note}")


def table_note(r: Result) -> str:
    """A row's note for a markdown table cell: one line (a failure's note quotes the engine's multi-line output)."""
    return " ".join((("FAILED " if not r.ok else "") + r.note).split()).replace("|", "/")


def megabytes(value: int | None) -> str:
    """Bytes as MB with two decimals ('' where not measured)."""
    return "" if value is None else f"{value / 1e6:,.2f}"


def backend_table(results: Sequence[Result]) -> str:
    """Issue 21's figures per engine run: wall, the operator's CPU by part, the state, and the bytes written to the
    backend during the run (checkpoint traffic), also as a multiple of the state it left."""
    shown = [r for r in results if r.backend_bytes is not None or r.state_bytes is not None]
    several = len({r.backend for r in shown}) > 1
    rows = ["| N | run | stacks | " + ("backend | " if several else "") + "wall s | engine CPU-s | provider CPU-s "
            "| program CPU-s | operator CPU-s/node | state KB | written to the backend MB | written / state | notes |",
            "|---:|---|---:|" + ("---|" if several else "") + "---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in shown:
        c = r.cpu
        state = "" if r.state_bytes is None else f"{r.state_bytes / 1e3:,.0f}"
        written = megabytes(r.backend_bytes)
        times = f"{r.backend_bytes / r.state_bytes:.1f}" if r.backend_bytes is not None and r.state_bytes else ""
        note = table_note(r)
        where = f"{backend_kind(r.backend)} | " if several else ""
        rows.append(f"| {r.size} | {r.scenario} | {r.stacks} | {where}{r.wall:.2f} | {c.engine:.1f} | {c.provider:.1f} "
                    f"| {c.program:.1f} | {(c.engine + c.provider + c.program) / r.size:.3f} | {state} | {written} "
                    f"| {times} | {note} |")
    return "\n".join(rows) if len(rows) > 2 else "(no engine runs measured)"


def cpu_split(c: Counters) -> str:
    """Where the CPU-s of ours + hosts went."""
    return (f"this process & scripts/ssh {c.bench_process:.1f} + engine CLI {c.engine:.1f} "
            f"+ language host & program {c.program:.1f} + provider {c.provider:.1f} + hosts {c.hosts:.1f}")


def is_floor(r: Result) -> bool:
    return r.scenario.startswith("floor")


def own_cpu(r: Result) -> float:
    """Ours + hosts CPU-s; for floor rows net of what the same spends idle."""
    return r.cpu_own_net if is_floor(r) else r.cpu_own


def table(results: Sequence[Result]) -> str:
    rows = ["| N | run | wall s | SSH conns | SSH/node | CPU-s machine | CPU-s ours + hosts "
            "| CPU-s/node (ours + hosts) | other work CPU-s/s | agents up s | state B/node (w/o PEM) | notes |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        mark = "*" if is_floor(r) else ""
        state = f"{r.state.per_node:,.0f} ({r.state.per_node_no_pem:,.0f})" if r.state else ""
        agents = f"{r.agents_up:.1f}" if r.agents_up is not None else ""
        other = (r.cpu.machine - r.cpu_own) / r.cpu.wall if r.cpu.wall > 0 else 0.0
        note = table_note(r)
        rows.append(f"| {r.size} | {r.scenario} | {r.wall:.2f} | {r.ssh} | {r.ssh / r.size:.1f} "
                    f"| {r.cpu.machine:.1f} | {own_cpu(r):.1f}{mark} ({r.cpu.operator:.1f} + {r.cpu.hosts:.1f}) "
                    f"| {own_cpu(r) / r.size:.2f}{mark} | {other:.2f} | {agents} | {state} | {note} |")
    return "\n".join(rows)


@dataclass
class Ratio:
    name: str
    value: float | None
    target: str
    met: bool | None
    how: str


def ratios(results: Sequence[Result], sizes: Sequence[int]) -> list[Ratio]:
    """The figures issue 6 sets targets for, at the smallest and largest size measured."""
    def get(size: int, scenario: str) -> Result | None:
        return next((r for r in results if r.size == size and r.scenario == scenario and r.ok), None)

    if not sizes:
        return []
    lo, hi = min(sizes), max(sizes)
    out: list[Ratio] = []

    def add(name: str, num: float | None, den: float | None, target: str, ok: Callable[[float], bool] | None,
            how: str = "") -> None:
        value = None if num is None or not den else num / den
        out.append(Ratio(name, value, target, None if value is None or ok is None else ok(value), how))

    up_hi, up_lo = get(hi, "pulumi up, from scratch"), get(lo, "pulumi up, from scratch")
    seq, par = get(hi, "baseline script, sequential"), get(hi, "baseline script, parallel")
    noop, empty = get(hi, "pulumi up, no-op"), get(hi, "pulumi up, empty stack")
    floor = get(hi, FLOOR)
    wall = lambda r: r.wall if r else None  # noqa: E731
    own = lambda r: r.cpu_own if r else None  # noqa: E731
    machine = lambda r: r.cpu.machine if r else None  # noqa: E731
    add(f"pulumi up time, {hi} nodes / {lo} node(s)", wall(up_hi), wall(up_lo), "<= 3", lambda v: v <= 3)
    add(f"baseline sequential wall / pulumi up time, {hi} nodes", wall(seq), wall(up_hi), ">= 8", lambda v: v >= 8)
    add(f"baseline parallel wall / pulumi up time, {hi} nodes", wall(par), wall(up_hi), ">= 2", lambda v: v >= 2)
    for base, label in ((seq, "sequential"), (par, "parallel")):
        add(f"CPU-s per node, pulumi up / baseline {label}, {hi} nodes: ours + hosts", own(up_hi), own(base),
            "<= 0.5", lambda v: v <= 0.5, "this process's cgroup (engine, program, provider, scripts, ssh) + the hosts' cgroups")
        add(f"CPU-s per node, pulumi up / baseline {label}, {hi} nodes: machine", machine(up_hi), machine(base),
            "<= 0.5", lambda v: v <= 0.5, "whole machine, other work on it included")
    operator = lambda r: r.cpu.operator if r else None  # noqa: E731
    hosts = lambda r: r.cpu.hosts if r else None  # noqa: E731
    for base, label in ((seq, "sequential"), (par, "parallel")):
        add(f"CPU-s per node on the operator's side, pulumi up / baseline {label}, {hi} nodes", operator(up_hi),
            operator(base), "(info)", None, "this process's cgroup only: what a real operator machine pays")
        add(f"CPU-s per node on the hosts, pulumi up / baseline {label}, {hi} nodes", hosts(up_hi), hosts(base),
            "(info)", None, "the hosts' cgroups only: what each real node pays")
    add(f"no-op up time, {hi} nodes / empty-stack up time", wall(noop), wall(empty), "<= 1.2", lambda v: v <= 1.2,
        "medians")
    out.append(Ratio(f"SSH connections of a no-op up, {hi} nodes", float(noop.ssh) if noop else None, "0",
                     None if noop is None else noop.ssh == 0, ""))
    for size in sorted(sizes):
        up = get(size, "pulumi up, from scratch")
        add(f"SSH connections per node per up, {size} node(s)", up.ssh if up else None, size, "1 (aim)",
            lambda v: v <= 1)
        if up and up.remote_ops:
            add(f"SSH connections per remote resource operation, {size} node(s)", up.ssh, up.remote_ops, "<= 1",
                lambda v: v <= 1, f"{up.remote_ops} operations on " + "/".join(REMOTE_TYPES))
    if up_hi and up_hi.state:
        out.append(Ratio(f"state bytes per node without PEM bodies, {hi} nodes", up_hi.state.per_node_no_pem,
                         "<= 4096", up_hi.state.per_node_no_pem <= 4096, ""))
    add(f"pulumi up CPU-s / floor CPU-s, {hi} nodes, ours + hosts", own(up_hi), floor.cpu_own_net if floor else None,
        "(info)", None, "floor: update-ca-certificates + starting the agent over 1 SSH connection, idle-corrected")
    add(f"baseline parallel CPU-s / floor CPU-s, {hi} nodes, ours + hosts", own(par),
        floor.cpu_own_net if floor else None, "(info)", None)
    nproc = os.cpu_count() or 1
    # The hosts share this machine's CPUs, so the floor's CPU / nproc bounds any up time here from below.
    floor_wall = max(floor.cpu_own_net / nproc, floor.wall) if floor else None
    how = (f"floor at {hi}: max(its CPU-s / {nproc} CPUs, its own wall) = {floor_wall:.1f}s" if floor and floor_wall
           else "no floor measured")
    add(f"least possible up time at {hi} nodes (the floor) / pulumi up time at {lo}", floor_wall, wall(up_lo),
        "(info)", None, how + "; compare with the <= 3 target")
    add(f"baseline sequential wall / least possible up time at {hi} nodes", wall(seq), floor_wall, "(info)", None,
        "the most speed-up over the sequential baseline this machine allows (target >= 8)")
    add(f"baseline parallel wall / least possible up time at {hi} nodes", wall(par), floor_wall, "(info)", None,
        "the same against the parallel baseline (target >= 2)")
    return out


def ratio_table(items: Sequence[Ratio]) -> str:
    rows = ["| ratio | value | target | met | how |", "|---|---:|---:|:---:|---|"]
    for r in items:
        value = "n/a" if r.value is None else f"{r.value:.2f}"
        met = "" if r.met is None and r.target == "(info)" else (
            "n/a" if r.met is None else ("yes" if r.met else "**no**"))
        rows.append(f"| {r.name} | {value} | {r.target} | {met} | {r.how} |")
    return "\n".join(rows)


def where_time_goes(results: Sequence[Result]) -> str:
    """Step timings of the engine runs and the script's phases, as text."""
    lines = []
    for r in results:
        if "timeline" in r.detail:
            tl = ", ".join(f"{k} {v:.1f}s" for k, v in r.detail["timeline"].items())
            lines.append(f"- N={r.size} {r.scenario}: {r.wall:.2f}s. Engine events at: {tl}. "
                         f"At most {r.detail.get('max_in_flight')} provider steps in flight; "
                         f"changes {r.detail.get('changes')}")
            ch = r.detail.get("chains") or {}
            if ch:
                lines.append(f"  - per node, certificate -> engine check: mean {ch['chain_mean_s']:.1f}s, max "
                             f"{ch['chain_max_s']:.1f}s; NodeIdentity end -> AgentInstall start: max "
                             f"{ch['identity_to_agent_gap_max_s']:.1f}s, {ch['gaps_over_idle']:.0f} node(s) over the "
                             f"transport's {ch['idle_seconds']:g}s idle limit (a pooled SSH connection closed)")
            if path := r.detail.get("critical_path"):
                lines.append(f"  - the last node's path ({sum(path.values()):.1f}s): "
                             + ", ".join(f"{k} {v:.2f}s" for k, v in path.items()))
            if scripts := r.detail.get("scripts"):
                lines.append("  - scripts on the nodes (round trip and time on the node), mean/max: " + ", ".join(
                    f"{k} x{v['runs']:.0f} {v['mean_s']:.2f}/{v['max_s']:.2f}s" for k, v in scripts.items()))
            for key, st in r.detail.get("steps", {}).items():
                if key.split()[0] in ("Stack", "Node", "pulumi-python"):
                    continue
                lines.append(f"  - {key}: {st['count']:.0f} steps, mean {st['mean_s']:.2f}s, max {st['max_s']:.2f}s, "
                             f"from {st['first_start_s']:.1f}s to {st['last_end_s']:.1f}s")
        elif "phases_mean_s" in r.detail:
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in r.detail["phases_mean_s"].items())
            lines.append(f"- N={r.size} {r.scenario}: {r.wall:.2f}s; per node, mean: {phases}")
    return "\n".join(lines)


def cpu_breakdown(results: Sequence[Result]) -> str:
    """CPU-s of each run split by cgroup, and the rest of the machine."""
    rows = ["| N | run | this process, scripts, ssh | engine CLI | language host + program | provider | hosts "
            "| other work on the machine |",
            "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = r.cpu
        rows.append(f"| {r.size} | {r.scenario} | {c.bench_process:.1f} | {c.engine:.1f} | {c.program:.1f} | {c.provider:.1f} "
                    f"| {c.hosts:.1f} | {c.machine - r.cpu_own:.1f} |")
    return "\n".join(rows)


def state_breakdown(results: Sequence[Result]) -> str:
    lines = []
    for r in results:
        if r.state is None:
            continue
        s, n = r.state, r.size
        fmt = lambda items, n=n: ", ".join(f"{k} {b / n:,.0f}" for k, b in items)  # noqa: E731
        lines.append(f"- N={n}: {s.total:,} B in all, {s.total_no_pem:,} without PEM bodies; per node without PEM:\n"
                     f"  - by resource type: {fmt(s.by_type_no_pem.items())}\n"
                     f"  - by field of a resource: {fmt(s.by_field_no_pem.items())}\n"
                     f"  - by who decides them (engine, SDK, this package): {fmt(s.by_owner_no_pem.items())}\n"
                     f"  - encrypted secrets (ciphertext): {s.secret_ciphertext / n:,.0f}\n"
                     f"  - biggest input/output values: {fmt(s.biggest_keys_no_pem)}")
    return "\n".join(lines)
