"""Light lab hosts in the benchmark (lab/light.py; docs/benchmark-method.md, "Light hosts"): the memory of an
onboarded host in both forms side by side (--memory-sizes), what host_capacity then says, and ksmd's cost."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.measure import host_capacity, parallel
from lab.light import KsmdSample

if TYPE_CHECKING:
    from bench.harness import Harness
    from bench.scenarios import Bench

#: ksmd's full scans of every mergeable page to wait for before light hosts are weighed: a page is merged once its
#: content was seen unchanged by one scan and matched by another.
SETTLE_SCANS = 2
#: The longest wait for them (a scan of 200 onboarded light hosts takes about 20 s at lab/light.py's rate).
SETTLE_TIMEOUT = 300.0
#: The window over which ksmd's CPU is measured with the fleet idle: it goes on scanning while nothing changes.
IDLE_WINDOW = 10.0
#: The fleet that issue 21 needs this machine to hold.
FLEET = 1000


def settle_ksm(bench: Harness, scans: int = SETTLE_SCANS, timeout: float = SETTLE_TIMEOUT) -> str:
    """Wait until ksmd has scanned everything `scans` more times (or `timeout`); say how long it took and its CPU."""
    start = KsmdSample.now()
    now = start
    while now.full_scans < start.full_scans + scans and now.at - start.at < timeout:
        time.sleep(1.0)
        now = KsmdSample.now()
    done = "" if now.full_scans >= start.full_scans + scans else f" (stopped waiting after {timeout:.0f} s)"
    return (f"; after {now.full_scans - start.full_scans} KSM scan(s) in {now.at - start.at:.0f} s{done}, ksmd "
            f"{now.cpu_seconds - start.cpu_seconds:.1f} CPU-s, {now.saved_mib:.0f} MiB merged away in all")


def run_memory(bench: Bench, size: int) -> None:
    """Onboard `size` fresh hosts of the default form with `pulumi up` and weigh them; then the same on light hosts.

    One row per form in bench.memory_rows: MiB per booted and per onboarded host, ksmd's CPU over the form's part
    (boot, `up`, settling) and with the fleet idle, and the hosts host_capacity says this machine holds at that
    weight. The lab is left in the form the other parts run on.
    """
    print(f"\n== N = {size}, memory per host: default and light hosts side by side", flush=True)
    try:
        for light in (False, True):
            bench.memory_rows.append(weigh_form(bench, size, light))
    finally:
        bench.stack_tag = ""
        stop_all(bench)
        bench.lab.set_light(bench.light_hosts)


def weigh_form(bench: Bench, size: int, light: bool) -> dict[str, Any]:
    stop_all(bench)
    bench.lab.set_light(light)
    bench.weights.clear()
    bench.stack_tag = "ml" if light else "m"  # a stack of its own per form: the other's nodes are in its state
    k0 = KsmdSample.now()
    hosts = bench.fresh_hosts(size)
    stack = bench.pulumi_runs(size, hosts, then=())
    k1 = KsmdSample.now()
    time.sleep(IDLE_WINDOW)
    k2 = KsmdSample.now()
    booted = bench.weights.get("booted", (0.0, 0.0, 0))
    onboarded = bench.weights.get("onboarded", (0.0, 0.0, 0))
    running = sum(1 for h in bench.lab.hosts.values() if h.running)
    capacity = host_capacity(onboarded[1], running, onboarded[2]) if stack is not None else 0
    row = {"size": size, "form": "light" if light else "default", "ok": stack is not None,
           "booted_mib": booted[0], "onboarded_mib": onboarded[0], "onboarded_max_mib": onboarded[1],
           "ksmd_cpu": k1.cpu_seconds - k0.cpu_seconds, "ksmd_seconds": k1.at - k0.at,
           "ksmd_idle_rate": (k2.cpu_seconds - k1.cpu_seconds) / (k2.at - k1.at),
           "merged_mib": k2.saved_mib if light else 0.0, "capacity": capacity, "tasks": onboarded[2]}
    bench.say(memory_line(row))
    return row


def stop_all(bench: Bench) -> None:
    parallel([h.stop for h in bench.lab.hosts.values()], workers=16)


def memory_line(row: dict[str, Any]) -> str:
    fits = "holds" if row["capacity"] >= FLEET else "does not hold"
    return (f"N={row['size']} {row['form']} hosts: {row['booted_mib']:.1f} MiB booted, {row['onboarded_mib']:.1f} "
            f"onboarded ({row['onboarded_max_mib']:.1f} at most); ksmd {row['ksmd_cpu']:.1f} CPU-s over "
            f"{row['ksmd_seconds']:.0f} s, {row['ksmd_idle_rate']:.3f} CPU-s/s idle; host_capacity "
            f"{row['capacity']}: this machine {fits} {FLEET:,} onboarded hosts" + ("" if row["ok"] else "  FAILED"))


def memory_table(rows: Sequence[dict[str, Any]]) -> str:
    """The side-by-side rows as a markdown table."""
    if not rows:
        return "(not measured: --memory-sizes not given)"
    lines = ["| N | host form | MiB per booted host | MiB per onboarded host (most) | ksmd CPU-s (over s) "
             "| ksmd CPU-s/s idle | MiB merged away | host_capacity | 1,000 onboarded hosts |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        fits = ("fit" if r["capacity"] >= FLEET else "do not fit") + ("" if r["ok"] else " (FAILED run)")
        lines.append(f"| {r['size']} | {r['form']} | {r['booted_mib']:.1f} | {r['onboarded_mib']:.1f} "
                     f"({r['onboarded_max_mib']:.1f}) | {r['ksmd_cpu']:.1f} ({r['ksmd_seconds']:.0f}) "
                     f"| {r['ksmd_idle_rate']:.3f} | {r['merged_mib']:.0f} | {r['capacity']:,} | {fits} |")
    return "\n".join(lines)
