"""Issue 40's figures: `pulumi up` of 1 to 30 nodes against the onboarding script and the hosts' floor, before and
after, from the results of `python -m bench.onboard` runs (their ``results.json``).

    sudo .venv/bin/python -m bench.onboard --sizes 1,10,30 --latency-sizes 1,10,30 --scale-sizes "" \\
        --shards "" --signer-sizes "" --repeats 1 --out after.md     # then the same in a checkout of "before"
    .venv/bin/python -m bench.small_fleets before=<logs>/results.json after=<logs>/results.json

prints the section of docs/benchmark.md: the targets, the runs side by side, the operator's CPU by process, and
where the time of each first `up` goes (the last node's path and each script's time on the nodes). Measurement
only, never a pass/fail test.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCRIPT_PARALLEL = "baseline script, parallel"
SCRIPT_SEQUENTIAL = "baseline script, sequential"
UP = "pulumi up, from scratch"
NOOP = "pulumi up, no-op"
PREVIEW = "pulumi preview"
FLOOR = "floor: update-ca-certificates + start agent, 1 SSH connection per node"
FLOOR_RATIO = 1.3
CPU_PER_NODE = 0.25
QUICK_SECONDS = 3.0
TARGET_N = 30


def load(arg: str) -> tuple[str, dict[str, Any]]:
    """``label=path`` -> (label, the run's results.json)."""
    label, _, path = arg.partition("=")
    return label, json.loads(Path(path).read_text())


def pick(run: dict[str, Any], scenario: str, size: int, delayed: bool) -> dict[str, Any] | None:
    """The run of ``scenario`` at ``size``, on the plain bridge or at +50 ms (its name then says so), if it
    succeeded."""
    name = f"{scenario} (+50 ms RTT)" if delayed else scenario
    for r in run["results"]:
        if r["scenario"] == name and r["size"] == size and bool(r.get("delay_ms")) == delayed and r["ok"]:
            return r  # type: ignore[no-any-return]
    return None


def wall(run: dict[str, Any], scenario: str, size: int, delayed: bool = False) -> float | None:
    r = pick(run, scenario, size, delayed)
    return None if r is None else float(r["wall"])


def fmt(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def targets(label: str, run: dict[str, Any]) -> list[str]:
    """Issue 40's four targets, each met or missed, for one run."""
    rows = []
    sizes = sorted({r["size"] for r in run["results"]})
    for delayed in (False, True):
        for n in sizes:
            up, script = wall(run, UP, n, delayed), wall(run, SCRIPT_PARALLEL, n, delayed)
            if up is None or script is None:
                continue
            where = "+50 ms RTT" if delayed else "plain bridge"
            rows.append(f"| {n} nodes, {where}: `up` / script in parallel | {up / script:.2f} | < 1 | "
                        f"{'met' if up < script else '**missed**'} | {up:.1f} s / {script:.1f} s |")
    for n in (10, TARGET_N):
        up, floor = wall(run, UP, n), wall(run, FLOOR, n)
        if up is not None and floor is not None:
            rows.append(f"| {n} nodes: `up` / floor | {up / floor:.2f} | <= {FLOOR_RATIO} | "
                        f"{'met' if up <= FLOOR_RATIO * floor else '**missed**'} | {up:.1f} s / {floor:.1f} s |")
    first = pick(run, UP, TARGET_N, False)
    if first is not None:
        c = first["cpu"]
        per_node = (c["engine"] + c["program"] + c["provider"]) / TARGET_N
        rows.append(f"| {TARGET_N} nodes: operator CPU-s per node (`up`) | {per_node:.3f} | <= {CPU_PER_NODE} | "
                    f"{'met' if per_node <= CPU_PER_NODE else '**missed**'} | engine {c['engine']:.1f} + program "
                    f"{c['program']:.1f} + provider {c['provider']:.1f} CPU-s |")
    for scenario in (NOOP, PREVIEW):
        r = pick(run, scenario, TARGET_N, False)
        if r is not None:
            rows.append(f"| {TARGET_N} nodes: {scenario.removeprefix('pulumi ')}, s | {r['wall']:.2f} | <= "
                        f"{QUICK_SECONDS:g}, no SSH | {'met' if r['wall'] <= QUICK_SECONDS and not r['ssh'] else '**missed**'} "
                        f"| {r['ssh']} SSH connections |")
    head = [f"**{label}**", "", "| target | value | wanted | | measured |", "|---|---:|---|---|---|"]
    return head + rows + [""]


def side_by_side(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Wall seconds of each size: the script one node after another and in parallel, `up`, the floor."""
    labels = [label for label, _ in runs]
    head = ("| nodes | RTT | script, sequential | script, parallel | "
            + " | ".join(f"`up` ({label})" for label in labels) + " | floor | "
            + " | ".join(f"no-op `up` ({label})" for label in labels) + " |")
    rows = [head, "|" + "---:|" * (5 + 2 * len(labels))]
    base = runs[-1][1]
    sizes = sorted({r["size"] for _, run in runs for r in run["results"]})
    for delayed in (False, True):
        for n in sizes:
            ups = [wall(run, UP, n, delayed) for _, run in runs]
            if all(u is None for u in ups):
                continue
            rows.append(f"| {n} | {'+50 ms' if delayed else 'LAN'} | {fmt(wall(base, SCRIPT_SEQUENTIAL, n, delayed))} "
                        f"| {fmt(wall(base, SCRIPT_PARALLEL, n, delayed))} | " + " | ".join(fmt(u) for u in ups)
                        + f" | {fmt(None if delayed else wall(base, FLOOR, n))} | "
                        + " | ".join(fmt(wall(run, NOOP, n, delayed), 2) for _, run in runs) + " |")
    return rows + ["", "The script's and the floor's columns are from the last run; each run measured them on its "
                   "own fresh hosts."]


def cpu(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """The operator's CPU of each first `up`, by process, and the hosts'."""
    rows = ["| package | nodes | RTT | engine | language host + program | provider | operator per node | hosts |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]
    for label, run in runs:
        for r in run["results"]:
            if r["scenario"].startswith(UP) and r["ok"]:
                c = r["cpu"]
                own = c["engine"] + c["program"] + c["provider"]
                rows.append(f"| {label} | {r['size']} | {'+50 ms' if r.get('delay_ms') else 'LAN'} | {c['engine']:.2f} | "
                            f"{c['program']:.2f} | {c['provider']:.2f} | {own / r['size']:.3f} | {c['hosts']:.1f} |")
    return rows


def paths(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each first `up`: the last node's path from the run's start, and each script's time on the nodes."""
    lines = []
    for label, run in runs:
        for r in run["results"]:
            if not r["scenario"].startswith(UP) or not r["ok"]:
                continue
            d = r["detail"]
            where = "+50 ms RTT" if r.get("delay_ms") else "LAN"
            path = d.get("critical_path") or {}
            steps = ", ".join(f"{k} {v:.2f}" for k, v in path.items())
            lines.append(f"- {label}, {r['size']} nodes, {where}: {r['wall']:.1f} s; the last node's path (s): {steps}")
            if scripts := d.get("scripts"):
                lines.append("  - scripts on the nodes, runs and mean/max s (a round trip and the time on the node): "
                             + ", ".join(f"{k} x{v['runs']:.0f} {v['mean_s']:.2f}/{v['max_s']:.2f}"
                                         for k, v in scripts.items()))
    return lines


def scale(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Item 4: the runs at a scale size (one stack, 100 nodes or more): each engine run and daily change, wall and
    CPU-s by process, side by side."""
    rows = ["| package | nodes | run | wall s | engine | language host + program | provider |",
            "|---|---:|---|---:|---:|---:|---:|"]

    def measured(run: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in run["results"] if r["size"] >= 100 and r["ok"] and (r.get("stacks") or 1) == 1
                and not r.get("delay_ms") and r["scenario"].startswith(("pulumi ", "daily: "))]

    at_scale = [run for _, run in runs if measured(run)]
    common = set.intersection(*({r["size"] for r in measured(run)} for run in at_scale)) if at_scale else set()
    for label, run in runs:
        for r in measured(run):
            if r["size"] in common:
                c = r["cpu"]
                rows.append(f"| {label} | {r['size']} | {r['scenario']} | {r['wall']:.1f} | {c['engine']:.1f} | "
                            f"{c['program']:.1f} | {c['provider']:.1f} |")
    return rows if len(rows) > 2 else []  # sizes every run measured at scale


def main(argv: Sequence[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    runs = [load(a) for a in argv]
    out = ["Runs: " + "; ".join(f"{label}: package {run['fingerprint']}, {run['started']}, `{run['command']}`"
                                 for label, run in runs), ""]
    for label, run in runs:
        if any(r["size"] <= TARGET_N for r in run["results"]):
            out += targets(label, run)
    small = [(label, run) for label, run in runs if any(r["size"] <= TARGET_N for r in run["results"])]
    if small:
        out += ["Wall seconds:", "", *side_by_side(small), "", "The operator's CPU-s of each first `up`:", "",
                *cpu(small), "", "Where the time of each first `up` goes:", "", *paths(small)]
    if rows := scale(runs):
        out += ["", "At scale, one stack (wall s, CPU-s):", "", *rows]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
