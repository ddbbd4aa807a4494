"""Test hosts: real-systemd Debian machines on one Linux box, reached over SSH.

A `Lab` is a set of hosts (lab/host.py: systemd-nspawn containers booting systemd
from a shared Debian rootfs through an overlay, each in its own network namespace)
on one bridge, with every kernel object named after the lab; lab/network.py holds
its network and its sweep, lab/base_layer.py the layer every host shares,
lab/linux.py the primitives. docs/test-hosts.md describes the layout, the jump-host
topology, the nspawn recipe and why each of its workarounds is needed.

The names tests, the benchmark and scripts import from here stay importable here.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

from lab import base_layer, light, linux, network
from lab.base_layer import USERS as USERS
from lab.base_layer import default_rootfs as default_rootfs
from lab.host import EXTRA_PRELUDE, Host, Segment
from lab.linux import CGROUP_ROOTS as CGROUP_ROOTS
from lab.linux import LabError, NetemUnavailable
from lab.linux import entered_netns as entered_netns

__all__ = ["USERS", "Host", "Lab", "LabError", "NetemUnavailable", "Segment", "entered_netns"]

#: Where lab/hosts.py had it; tests/lab/test_hosts.py imports it from here.
_resolve_inside = linux.resolve_inside

MAX_HOSTS = 200
HOST_ADDR_OFFSET = 20
#: Hosts whose addresses fit in the subnet's /24 (.21 to .254); a lab of more spans a /21 (see `max_hosts`).
HOSTS_PER_24 = 254 - HOST_ADDR_OFFSET
#: Hosts whose addresses fit in a /21 (the benchmark's 1,000-node runs need more than one /24).
HOSTS_PER_21 = 2046 - HOST_ADDR_OFFSET


@dataclass
class Lab:
    """A set of test hosts on one bridge, with every kernel object named after `name`.

    - `name`: 1-3 lowercase letters. Interface names must fit in 15 chars, and
      letters only keep the sweep patterns (`lg<name>h<digits>`) unambiguous.
    - `subnet`: the first three octets of a /24; `.1` is the gateway (the bridge).
    - `private_subnet`: the private segment's /24 (docs/test-hosts.md); by
      default `subnet` with its third octet XOR 128 (10.250.0 -> 10.250.128). Made on
      first use, after checking that nothing on the machine routes it yet.
    - `workdir`: key, base layer, host dirs and console logs; kept by teardown.
    - `rootfs`: the Debian tree; by default lab/rootfs.sh's cached one.
    - `host_key_types`: the SSH host keys each host generates on first boot.
      "rsa" is left out by default because its keygen dominates boot time.
    - `max_hosts`: the most hosts it holds (200 by default). Above 234 the main
      network is the /21 that starts at `subnet` (its third octet a multiple of 8):
      host addresses run on from `<subnet>.254` into the next /24s; private-segment
      hosts stay within 234.
    - `light`: the light host form (lab/light.py; docs/test-hosts.md, "Light hosts"), for the benchmark's large
      fleets only: KSM and no ASLR in every host, no D-Bus or logind; setup starts ksmd. The tests use the default.
    - `system_cas`: when set, each host trusts only that many of Debian's system CAs, written into its
      /etc/ca-certificates.conf before every boot (lab.host.trust_first_system_cas): the update-ca-certificates
      of every onboarding then runs a few processes per CA instead of per ~140. The tests use 3; the benchmark
      measures the full set unless given --reduced-ca.
    - `hosts`: the hosts prepared so far, by index.

    Usage: `setup()`, `boot(n)`, talk SSH to `host.addr`, `teardown()` (or `with Lab(...) as lab`).
    Behind a bastion: `prepare(1, segment="both")`, `prepare(2, segment="private")`, start
    both, and reach host 2 with `ssh -J deploy@<host 1 addr> deploy@<host 2 addr>`.
    """

    name: str
    subnet: str
    workdir: Path
    rootfs: Path | None = None
    private_subnet: str = ""
    host_key_types: tuple[str, ...] = ("ed25519", "ecdsa")
    max_hosts: int = MAX_HOSTS
    light: bool = False
    system_cas: int | None = None
    hosts: dict[int, Host] = field(default_factory=dict, init=False, repr=False)
    _extras: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z]{1,3}", self.name):
            raise ValueError(f"lab name must be 1-3 lowercase letters, got {self.name!r}")
        octets = self.subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets):
            raise ValueError(f"subnet must be three octets like '10.250.0', got {self.subnet!r}")
        if not self.private_subnet:
            self.private_subnet = f"{octets[0]}.{octets[1]}.{int(octets[2]) ^ 128}"
        private = self.private_subnet.split(".")
        if len(private) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in private) or private == octets:
            raise ValueError(f"private_subnet must be three octets other than the subnet's, got {self.private_subnet!r}")
        unknown = set(self.host_key_types) - {"ed25519", "ecdsa", "rsa"}
        if unknown or not self.host_key_types:
            raise ValueError(f"host_key_types must be some of ed25519, ecdsa, rsa; got {self.host_key_types!r}")
        if not 1 <= self.max_hosts <= HOSTS_PER_21:
            raise ValueError(f"max_hosts must be 1..{HOSTS_PER_21}, got {self.max_hosts}")
        if self.prefix_len < 24 and int(octets[2]) % 8:
            raise ValueError(f"a lab of more than {HOSTS_PER_24} hosts spans a /21: the subnet's third octet must be "
                             f"a multiple of 8, got {self.subnet!r}")
        self.workdir = Path(self.workdir).resolve()

    # ----------------------------------------------------------------- names and paths

    @property
    def prefix(self) -> str:
        return f"lg{self.name}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    @property
    def private_netns(self) -> str:
        """The netns holding the private segment's bridge `br0` (no leg in the root namespace)."""
        return f"{self.prefix}-priv"

    @property
    def base_dir(self) -> Path:
        return self.workdir / ("base-light" if self.light else "base")

    @property
    def hosts_dir(self) -> Path:
        """Where every host's dirs lie (upper, work, merged root); a bind mount of itself once `setup` ran."""
        return self.workdir / "hosts"

    @property
    def ssh_key_path(self) -> Path:
        return self.workdir / "ssh" / "id_ed25519"

    @property
    def ssh_private_key(self) -> str:
        return self.ssh_key_path.read_text()

    @property
    def ssh_public_key(self) -> str:
        """The OpenSSH public key line of the lab key."""
        return base_layer.public_key(self.ssh_key_path, f"lab-{self.name}")

    @property
    def pwsudo_password(self) -> str:
        """The password of `pwsudo` (sudo asks for it; SSH password login is off)."""
        return (self.base_dir / "pwsudo-password").read_text().strip()

    @property
    def rootfs_path(self) -> Path:
        if self.rootfs is None:
            self.rootfs = base_layer.default_rootfs()
        return self.rootfs

    @property
    def prefix_len(self) -> int:
        """The main network's prefix length: 24, or 21 for a lab of more than HOSTS_PER_24 hosts."""
        return 24 if self.max_hosts <= HOSTS_PER_24 else 21

    def main_address(self, offset: int) -> str:
        """The address `offset` after `<subnet>.0` on the main network."""
        return str(ipaddress.IPv4Address(f"{self.subnet}.0") + offset)

    def addr(self, index: int) -> str:
        return self.main_address(HOST_ADDR_OFFSET + index)

    def private_addr(self, index: int) -> str:
        """Host `index`'s address on the private segment."""
        return f"{self.private_subnet}.{HOST_ADDR_OFFSET + index}"

    # ----------------------------------------------------------------- setup / teardown

    def setup(self) -> None:
        """Sweep what an earlier run of this lab name left, then create bridge, key and base layer."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.teardown()
        linux.raise_inotify_limits()
        linux.raise_neighbour_limits(self.max_hosts)
        linux.raise_backlog_limit(self.max_hosts)
        network.check_subnet_free(self, self.subnet, self.prefix_len)
        linux.run(["ip", "link", "add", self.bridge, "type", "bridge"])
        network.no_router_solicitations(self.bridge)  # before it is up
        linux.run(["ip", "addr", "add", f"{self.gateway}/{self.prefix_len}", "dev", self.bridge])
        linux.run(["ip", "link", "set", self.bridge, "up"])
        base_layer.ensure_key(self.ssh_key_path, f"lab-{self.name}")
        self._mount_hosts_dir()
        self._prepare_form()

    def _mount_hosts_dir(self) -> None:
        """Make the hosts dir a mount of its own, so a new mount namespace drops every host root in one unmount.

        Workaround 5 (lab/host.py, DETACH_LAB_MOUNTS). Teardown's sweep unmounts it with everything under the workdir.
        """
        self.hosts_dir.mkdir(parents=True, exist_ok=True)
        if not linux.is_mounted(self.hosts_dir):
            linux.run(["mount", "--bind", str(self.hosts_dir), str(self.hosts_dir)])

    def set_light(self, on: bool) -> None:
        """Switch the form of the hosts booted from now on (the benchmark measures both side by side).

        Every host must be stopped: a host's root is mounted over the base layer of the form it booted with.
        """
        if on == self.light:
            return
        running = sorted(h.name for h in self.hosts.values() if h.running)
        if running:
            raise LabError(f"cannot switch the host form of lab {self.name} while hosts run: {', '.join(running)}")
        self.light = on
        self._prepare_form()

    def _prepare_form(self) -> None:
        """The base layer of the current form, and ksmd running for light hosts.

        ksmd is left running: it scans only memory marked mergeable and sleeps while there is none, and stopping it
        at teardown would stop it under another light lab of the machine.
        """
        base_layer.ensure_base(self.base_dir, self.rootfs_path, self.ssh_public_key, self.host_key_types, f"{self.prefix}base",
                               light=self.light)
        if self.light:
            light.start_ksmd()

    def teardown(self) -> None:
        """Stop everything of this lab and remove its kernel objects; idempotent and crash-safe.

        The workdir (key, base layer, host upper dirs) stays, for inspection and reuse.
        """
        try:
            linux.parallel([h.stop for h in self.hosts.values()])
        finally:  # a host that failed to stop (a cgroup still busy) is swept with the rest: the error is raised after
            for proc in self._extras:
                self._stop_extra(proc)
            self._extras.clear()
            self.hosts.clear()
            network.sweep(self)

    def __enter__(self) -> Self:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # ----------------------------------------------------------------- hosts

    def prepare(self, index: int, hostname: str | None = None, segment: Segment = "main") -> Host:
        """Create the netns, veth(s) and overlay dirs of host `index` (not booted).

        `segment`: "main" (the default), "private" (only interface on the private
        segment, unreachable from the root namespace) or "both" (a bastion: eth0 on
        the main bridge, eth1 on the private segment, no IP forwarding).
        Preparing an index again returns the same Host (with the new hostname, if given).
        A host whose netns already exists was prepared by another process (lab/vmctl.py):
        its network is adopted as it is.
        """
        if not 1 <= index <= self.max_hosts:
            raise ValueError(f"host index must be 1..{self.max_hosts}, got {index}")
        if segment != "main" and index > HOSTS_PER_24:
            raise ValueError(f"a host on the private segment needs an index of 1..{HOSTS_PER_24}, got {index}")
        with self._lock:
            host = self.hosts.get(index)
            if host is not None:
                if segment != host.segment:
                    raise ValueError(f"host {index} is on segment {host.segment!r}, not {segment!r}")
                if hostname is not None:
                    host.hostname = hostname
                return host
            hdir = self.hosts_dir / str(index)
            host = Host(
                lab=self,
                index=index,
                hostname=hostname or f"node{index}",
                name=f"{self.prefix}h{index}",
                addr=self.private_addr(index) if segment == "private" else self.addr(index),
                upper=hdir / "up",
                work=hdir / "wk",
                root=hdir / "merged",
                console_log=hdir / "console.log",
                segment=segment,
            )
            self.hosts[index] = host
        if host.netns not in linux.netns_list():
            network.add_netns(self, host.netns, str(index), HOST_ADDR_OFFSET + index, segment)
        for d in (host.upper, host.work, host.root):
            d.mkdir(parents=True, exist_ok=True)
        return host

    def boot(self, n: int, start: int = 1) -> list[Host]:
        """Prepare and start hosts start..start+n-1 in parallel; return them once every sshd answers."""

        def one(i: int) -> Host:
            host = self.prepare(i)
            host.start()
            return host

        return linux.parallel([functools.partial(one, i) for i in range(start, start + n)])

    # ----------------------------------------------------------------- extra namespaces

    def add_netns(self, netns_suffix: str = "repo", addr_index: int = 2, segment: Segment = "main") -> str:
        """Create (once) the extra netns `lg<name><suffix>`; return its name.

        It gets `<subnet>.<addr_index>` on the main bridge, `<private_subnet>.<addr_index>`
        on the private segment, or both (eth0 main, eth1 private), per `segment`. Keep
        addr_index below 20 (hosts start at 21). Teardown deletes it.
        """
        if not re.fullmatch(r"[a-z][a-z0-9]*", netns_suffix) or re.fullmatch(r"h\d+|br", netns_suffix):
            raise ValueError(f"netns suffix must be lowercase alphanumeric, not h<N> or br: {netns_suffix!r}")
        netns, veth = f"{self.prefix}{netns_suffix}", self._veth(netns_suffix, "main")
        if len(veth) > 15:
            raise ValueError(f"netns suffix too long: interface name {veth!r} exceeds 15 chars")
        network.remember(self, "extra_netns", netns)
        if netns not in linux.netns_list():
            network.add_netns(self, netns, netns_suffix, addr_index, segment)
        return netns

    def run_in_netns(
        self,
        argv: Sequence[str],
        netns_suffix: str = "repo",
        addr_index: int = 2,
        segment: Segment = "main",
        **popen_kwargs: Any,
    ) -> subprocess.Popen[bytes]:
        """Start argv in the extra netns of `add_netns(netns_suffix, addr_index, segment)`.

        For lab services the hosts must reach, such as the release server; with
        segment="private", private hosts reach it and the root namespace does not.
        The process is tracked and killed (with its process group) by teardown.
        """
        netns = self.add_netns(netns_suffix, addr_index, segment)
        popen_kwargs.setdefault("start_new_session", True)
        wrapped = ["unshare", "--mount", "--propagation", "private", "env", f"LAB_HOSTS_MNT={self.hosts_dir}",
                   "sh", "-c", EXTRA_PRELUDE, "lab-extra",
                   "ip", "netns", "exec", netns, *argv]  # fmt: skip
        proc: subprocess.Popen[bytes] = subprocess.Popen(wrapped, **popen_kwargs)
        self._extras.append(proc)
        return proc

    # ----------------------------------------------------------------- internals


    def _veth(self, key: str, segment: Literal["main", "private"]) -> str:
        """The bridge side of a veth: in the root namespace for main, in `private_netns` for private."""
        return f"{self.prefix}v{key}" if segment == "main" else f"v{key}"


    @staticmethod
    def _stop_extra(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
