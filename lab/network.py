"""A lab's network and its sweep: the bridge, the private segment, extra netns, and removing every kernel
object a lab of this name left behind (docs/test-hosts.md, "Network" and "Sweep")."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lab import linux
from lab.host import Segment
from lab.linux import LabError

if TYPE_CHECKING:
    from lab.hosts import Lab


def state_file(lab: Lab) -> Path:
    """Where the lab records what a sweep cannot find by name: extra netns and root-namespace routes."""
    return lab.workdir / "lab-state.json"


def unreachable_route(lab: Lab) -> list[str]:
    """The route that stops the root namespace's packets to the private segment leaving by the default route."""
    return ["unreachable", f"{lab.private_subnet}.0/24"]


def cgroup_tops(lab: Lab) -> tuple[Path, ...]:
    """The lab's cgroup subtree in each hierarchy (its hosts are `h<i>` below)."""
    return tuple(cg / lab.prefix for cg in linux.CGROUP_ROOTS)


def check_subnet_free(lab: Lab, subnet: str, prefix_len: int = 24) -> None:
    """Refuse a subnet whose gateway address another interface (another lab?) already has,
    or that the root namespace already routes (another lab's bridge or private segment)."""
    gateway = f"{subnet}.1"
    out = linux.run(["ip", "-o", "-4", "addr", "show"]).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields[3].split("/")[0] == gateway:
            raise LabError(f"{gateway} is already on {fields[1]}; pick another subnet for lab {lab.name}")
    network = f"{subnet}.0/{prefix_len}"
    routes = linux.run(["ip", "-o", "route", "show", "table", "all", "root", network]).stdout.strip()
    if routes:
        raise LabError(f"{network} is already routed ({routes.splitlines()[0]}); "
                       f"pick another subnet for lab {lab.name}")  # fmt: skip


def ensure_private_segment(lab: Lab) -> None:
    """Create the private segment (its netns, bridge and unreachable route) on first use."""
    with lab._lock:
        if lab.private_netns in linux.netns_list():
            return
        check_subnet_free(lab, lab.private_subnet)
        remember(lab, "routes", " ".join(unreachable_route(lab)))
        linux.run(["ip", "route", "add", *unreachable_route(lab)])
        linux.run(["ip", "netns", "add", lab.private_netns])
        no_router_solicitations("default", lab.private_netns)
        for cmd in (["link", "add", "name", "br0", "type", "bridge"], ["link", "set", "dev", "br0", "up"]):
            linux.run(["ip", "-n", lab.private_netns, *cmd])


def no_router_solicitations(conf: str, netns: str | None = None) -> None:
    """``net.ipv6.conf.<conf>.router_solicitations`` 0, in ``netns`` (None: this one); nothing without IPv6.

    A lab network has no IPv6 router, and a host's kernel, left to its default, asks for one for as long as it
    runs: an ICMPv6 router solicitation to ff02::2, again and again with a growing interval, which the kernel's timer
    wheel rounds (HZ 250: to 16.384 s for intervals of minutes) to the same ticks on every host. The bridge floods
    each solicitation to every port, one copy per host through this CPU's input queue (`netdev_max_backlog`), which
    loopback traffic shares: at 1,000 hosts, 11 to 12 hosts' solicitations on each tick were 12,000 copies at once,
    and /proc/net/softnet_stat counted bursts of 33,000 to 70,000 packets dropped every 16.4 s, loopback connections'
    packets among them (the benchmark's `connection reset by peer` of the engine's `LanguageRuntime/Run` fell on a
    16.39-second grid). So no lab host, and not the bridge, solicits a router."""
    if not Path("/proc/sys/net/ipv6").is_dir():
        return
    prefix = linux.nsenter(netns) if netns else []
    linux.run([*prefix, "sysctl", "-q", "-w", f"net.ipv6.conf.{conf}.router_solicitations=0"])


def add_netns(lab: Lab, netns: str, key: str, addr_index: int, segment: Segment) -> None:
    """A netns with eth0 on the main bridge or the private segment; for "both", eth0 main and eth1 private."""
    legs: list[tuple[list[str], str, str, str]] = []  # (ip option for the bridge side, veth, bridge, address)
    if segment != "private":
        legs.append(([], lab._veth(key, "main"), lab.bridge, f"{lab.main_address(addr_index)}/{lab.prefix_len}"))
    if segment != "main":
        ensure_private_segment(lab)
        legs.append((["-n", lab.private_netns], lab._veth(key, "private"), "br0", f"{lab.private_subnet}.{addr_index}/24"))
    linux.run(["ip", "netns", "add", netns])
    no_router_solicitations("default", netns)  # before its links exist: they take the netns's defaults
    for n, (side, veth, bridge, address) in enumerate(legs):
        linux.run(["ip", *side, "link", "add", "name", veth, "type", "veth", "peer", "name", f"eth{n}", "netns", netns])
        linux.run(["ip", *side, "link", "set", "dev", veth, "master", bridge, "up"])
        linux.run(["ip", "-n", netns, "addr", "add", address, "dev", f"eth{n}"])
        linux.run(["ip", "-n", netns, "link", "set", f"eth{n}", "up"])
    linux.run(["ip", "-n", netns, "link", "set", "lo", "up"])


def remember(lab: Lab, kind: Literal["extra_netns", "routes"], item: str) -> None:
    """Record extra netns names and root-namespace routes on disk, so a setup after a crash can find them."""
    state = read_state(lab)
    if item not in state[kind]:
        state[kind].append(item)
        lab.workdir.mkdir(parents=True, exist_ok=True)
        state_file(lab).write_text(json.dumps(state))


def read_state(lab: Lab) -> dict[str, list[str]]:
    try:
        state: dict[str, list[str]] = json.loads(state_file(lab).read_text())
    except (OSError, ValueError):
        state = {}
    state.setdefault("extra_netns", [])
    state.setdefault("routes", [])
    return state


def own_netns(lab: Lab) -> list[str]:
    """This lab's netns: hosts by name, extras from the state file or from their veth.

    An extra's name alone is ambiguous between labs (lab "x" with suffix "yrepo"
    and lab "xy" with "repo" both give "lgxyrepo"), so an extra counts as ours only
    when recorded in this workdir or when its veth is on our bridge, has our veth
    name or is on our private segment; the veth tells which netns its peer is in.
    The private segment's netns is ours by its name (lab names have no "-").
    """
    existing = linux.netns_list()
    host_re = re.compile(rf"{lab.prefix}h\d+")
    own = {ns for ns in existing if host_re.fullmatch(ns) or ns == lab.private_netns}
    own |= set(read_state(lab)["extra_netns"]) & set(existing)
    veth_re = re.compile(rf"\d+: {lab.prefix}v[a-z0-9]+@")
    lines = linux.run(["ip", "-o", "link", "show"]).stdout.splitlines()
    veths = [line for line in lines if veth_re.match(line) or f" master {lab.bridge} " in line]
    if lab.private_netns in existing:  # every veth on the private segment is ours
        veths += linux.run([*linux.nsenter(lab.private_netns), "ip", "-o", "link", "show"]).stdout.splitlines()
    for line in veths:
        peer = re.search(r" link-netns (\S+)", line)
        if peer and peer.group(1) in existing:
            own.add(peer.group(1))
    return sorted(own)


def sweep(lab: Lab) -> None:
    """Remove every kernel object of this lab name, including leftovers of a killed run.

    Order matters: processes first (a netns whose processes live on keeps its veth,
    and a busy mount cannot be unmounted), then mounts, netns, links, cgroups.
    """
    # nspawn processes of an earlier run of this workdir; they are not our children.
    needle = str(lab.workdir).encode()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if b"systemd-nspawn" in cmdline and needle in cmdline:
            linux.kill_pids([int(pid_dir.name)])
    for top in cgroup_tops(lab):
        linux.kill_cgroup(top)
    owned = own_netns(lab)
    for ns in owned:
        pids = linux.run(["ip", "netns", "pids", ns], check=False).stdout.split()
        linux.kill_pids(int(p) for p in pids)
    # Mounts: host roots and the base-layer build mount, found by their source tag or place.
    tag = re.compile(rf"{lab.prefix}(h\d+|base)")
    inside = str(lab.workdir) + "/"
    ours = [m for m, fs, src in linux.mountinfo() if (fs == "overlay" and tag.fullmatch(src)) or m.startswith(inside)]
    for mountpoint in sorted(set(ours), key=len, reverse=True):
        linux.umount(Path(mountpoint))
    routes = set(read_state(lab)["routes"])  # only routes this lab made: another lab may use the subnet
    if lab.private_netns in owned:  # made just after its route
        routes.add(" ".join(unreachable_route(lab)))
    for ns in owned:
        linux.run(["ip", "netns", "del", ns], check=False)
    link_re = re.compile(rf"{lab.prefix}v\w+|{lab.prefix}br")
    for link in linux.link_names():
        if link_re.fullmatch(link):
            linux.run(["ip", "link", "del", link], check=False)
    for route in routes:
        linux.run(["ip", "route", "del", *route.split()], check=False)
    for top in cgroup_tops(lab):
        linux.remove_cgroup(top)
    state_file(lab).unlink(missing_ok=True)
