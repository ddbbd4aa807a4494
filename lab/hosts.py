"""Test hosts: real-systemd Debian machines on one Linux box, reached over SSH.

Each host is a `systemd-nspawn` container that boots systemd 252 from a shared
Debian rootfs (lab/rootfs.sh) through an overlay:

    lowerdir = <workdir>/base/up : <rootfs>     shared, read-only to hosts
    upperdir = <workdir>/hosts/<i>/up           what this host changed
    mount    = <workdir>/hosts/<i>/merged       the host's /, readable from outside

Every host has its own network namespace `lg<name>h<i>`, joined to the bridge
`lg<name>br` (the lab gateway, `<subnet>.1`, in the root namespace) by the veth
`lg<name>v<i>`. Hosts get `<subnet>.<20+i>/24` and no default route, and IP
forwarding stays off, so nothing a host sends leaves the bridge.

Jump-host topology (`Lab.prepare(i, segment=...)`): a second, private segment
(`<private_subnet>.0/24`, by default the subnet with its third octet XOR 128,
e.g. 10.250.0 -> 10.250.128) is a bridge inside its own netns `lg<name>-priv`,
not in the root namespace. A "private" host's only interface is on it; a "both"
host (a bastion) has eth0 on the main bridge and eth1 on the private one, with IP
forwarding off (it relays SSH channels, not packets). The root namespace, where
the tests and `pulumi` run, has no interface on the private segment, and an
`unreachable <private_subnet>.0/24` route stops its packets from leaving by the
machine's default route: a private host is reached only through a bastion.
Services private hosts need run in extra netns on that segment
(`run_in_netns(..., segment="private")`, or in-process through `entered_netns`).

    root netns: lg<name>br <subnet>.1 -- main hosts, bastion eth0, main extras
    lg<name>-priv netns: bridge br0 -- private hosts, bastion eth1, private extras

All kernel objects (netns, links, cgroups, overlay mount sources) carry the
prefix `lg<name>`, so two labs with different names coexist and each one can
sweep what a killed earlier run of the same name left behind, without touching
the other.

The recipe, and why each of its workarounds is needed, is in
shared/docs/test-hosts.md section 3 ("nspawn backend B"); the short version:

1. `--register=no --keep-unit`: the machine has no systemd/D-Bus to register with.
2. nspawn runs in a private mount namespace with a tmpfs on /run/systemd,
   because /run here is not a tmpfs and nspawn refuses to clean
   /run/systemd/nspawn/propagate on a disk file system.
3. Each nspawn is moved into its own cgroup `lg<name>/h<i>` in both the
   unified and the named systemd hierarchy, else every container lands in the
   same `/payload` cgroup and their systemd trees collide.
4. `/etc/hostname` and `/etc/hosts` are written into every host, because systemd
   prefers the file over `--hostname`.

The host processes are children of this Python process (`subprocess.Popen`), so
stopping a host is SIGTERM + wait, and no zombie lingers until some other reaper
gets to it. A `reboot` run inside a host makes nspawn exit with 133; a watcher
thread boots the host again, as a real machine would come back.

Link delay (`Host.set_link_delay`) needs the kernel's netem qdisc; this project's
CI machine kernel has none (`tc` says "Error: Specified qdisc kind is unknown."),
so it raises NetemUnavailable there.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat as stat_module
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

__all__ = ["USERS", "Host", "Lab", "LabError", "NetemUnavailable", "Segment", "entered_netns"]

ROOTFS_SCRIPT = Path(__file__).with_name("rootfs.sh")
CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
SSH_PORT = 22
BOOT_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
MAX_HOSTS = 200
HOST_ADDR_OFFSET = 20
NSPAWN_REBOOT_EXIT = 133  # systemd-nspawn's exit code when the container asked for a reboot
CLONE_NEWNET = 0x40000000

#: Where a host or extra netns has its legs: the main bridge, the private segment, or both (a bastion).
Segment = Literal["main", "private", "both"]

#: Login users of the base layer: every one accepts the lab key; they differ in sudo rights.
USERS = ("deploy", "nosudo", "pwsudo")

#: Bumped whenever the base layer recipe changes, so cached base layers are rebuilt.
BASE_VERSION = 2

#: Units that are useless in a lab container and either slow the boot, fail
#: there, or run apt/dpkg jobs at random times (which would take the dpkg lock
#: in the middle of a test). They are masked in the base layer.
MASKED_UNITS = (
    "getty@tty1.service",
    "console-getty.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "systemd-pstore.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
)

SSHD_DROPIN = """\
# Lab hosts: key login only, no DNS look-ups (there is no DNS), and room for
# many parallel connections from the tests.
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 100:30:200
MaxSessions 50
"""

JOURNALD_DROPIN = """\
# Lab hosts: keep the persistent journal (reboot tests read earlier boots) but
# small; journald's defaults preallocate 8 MB per journal file, 30+ MB a host.
[Journal]
SystemMaxUse=16M
SystemMaxFileSize=1M
"""

# Shell code run first in every private mount namespace the lab starts a
# long-lived process in. Such a namespace begins as a copy of the root one, with
# every lab host's overlay mount in it; while a copy lives, a host that stops and
# starts again finds its upper dir "in use by another mount" (overlayfs warns:
# accessing files from both mounts will result in undefined behavior). So drop
# the copies, except the host's own root ($LAB_OWN_ROOT).
_DETACH_LAB_MOUNTS = r"""
awk -v own="${LAB_OWN_ROOT:-}" '{
    for (i = 7; i <= NF && $i != "-"; i++) ;
    if ($(i+1) == "overlay" && $(i+2) ~ /^lg[a-z]+(h[0-9]+|base)$/ && $5 != own) print $5
}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" || true; done
"""

# Runs inside `unshare --mount --propagation private`, as the process that then
# becomes systemd-nspawn (exec keeps the pid, so Popen.pid is the nspawn pid).
_NSPAWN_PRELUDE = (
    "set -eu\n"
    'for cg in $LAB_CGROUPS; do echo $$ > "$cg/cgroup.procs"; done  # workaround 3\n'
    + _DETACH_LAB_MOUNTS
    + "# Workaround 2: nspawn needs /run/systemd/nspawn on a tmpfs. Mounting it over\n"
    "# /run/systemd, in this namespace only, leaves nothing behind in the machine's /run.\n"
    'mount -t tmpfs -o mode=0755,size=16m "$LAB_TMPFS" /run/systemd\n'
    "mkdir -p /run/systemd/nspawn\n"
    'exec "$@"\n'
)

# The same for a process started in an extra netns (`ip netns exec` makes yet another
# mount namespace, a copy of this cleaned one).
_EXTRA_PRELUDE = _DETACH_LAB_MOUNTS + 'exec "$@"\n'


class LabError(RuntimeError):
    """A lab operation failed; the message says which command and why."""


class NetemUnavailable(LabError):
    """The kernel has no `netem` qdisc, so link delay cannot be emulated."""


T = TypeVar("T")


# --------------------------------------------------------------------------- helpers


def _run(argv: Sequence[str], *, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output, and raise LabError with its stderr on failure."""
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed (rc={proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _parallel(fns: Iterable[Callable[[], T]]) -> list[T]:
    """Run callables in threads; wait for all of them, then re-raise the first error.

    Waiting for all before raising keeps every started host tracked, so teardown
    can still stop them.
    """
    jobs = list(fns)
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(fn) for fn in jobs]
        errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err
    return [f.result() for f in futures]


INOTIFY_LIMITS = {"max_user_instances": 8192, "max_user_watches": 1048576}


def _raise_inotify_limits() -> None:
    """Every container's systemd and journald take inotify instances from root's share.

    With the kernel default of 128 instances per user, about 30 hosts exhaust
    it and the next systemd-nspawn exits 255 without a word (inotify_init1:
    EMFILE). Raise the limits; never lower them.
    """
    for name, want in INOTIFY_LIMITS.items():
        path = Path("/proc/sys/fs/inotify") / name
        if int(path.read_text()) < want:
            path.write_text(str(want))


def _mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, fs type, source) of every mount in our mount namespace."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        mountpoint = pre.split()[4].replace("\\040", " ")
        fstype, source = (post.split() + ["", ""])[:2]
        mounts.append((mountpoint, fstype, source))
    return mounts


def _umount(path: Path) -> None:
    """Unmount, retrying briefly when busy, and fall back to a lazy unmount."""
    for _ in range(20):
        if _run(["umount", str(path)], check=False).returncode == 0:
            return
        if not any(m == str(path) for m, _, _ in _mountinfo()):
            return
        time.sleep(0.05)
    _run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def entered_netns(netns: str) -> Iterator[None]:
    """Run the body with this thread (only) in the named network namespace.

    A socket made in the body stays in that namespace after it ends: an
    in-process server (lab.control_plane.ControlPlane(netns=...)) can listen on
    the private segment, and the lab can knock on a private host's sshd.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def setns(fd: int) -> None:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns to {netns}: {os.strerror(err)}")

    with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{netns}") as target:
        setns(target.fileno())
        try:
            yield
        finally:
            setns(home.fileno())


def _nsenter(netns: str) -> list[str]:
    """Command prefix to run a short command in a netns.

    nsenter joins only the netns; `ip netns exec` would also make a mount namespace
    copy holding every host's overlay (see _DETACH_LAB_MOUNTS).
    """
    return ["nsenter", f"--net=/run/netns/{netns}"]


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = _run(["ip", "-o", "link", "show"]).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()]


def _kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _cgroup_dirs(top: Path) -> list[Path]:
    """Every cgroup directory under top (top included), deepest first."""
    if not top.is_dir():
        return []
    dirs = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids(top: Path) -> list[int]:
    pids: list[int] = []
    for d in _cgroup_dirs(top):
        try:
            pids += [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except OSError:
            pass
    return pids


def _kill_cgroup(top: Path, timeout: float = 10.0) -> None:
    """SIGKILL everything in a cgroup subtree until it is empty.

    Needed after a crash: a SIGKILLed nspawn leaves the container's systemd
    running, reparented, in the container's cgroup.
    """
    deadline = time.monotonic() + timeout
    while (pids := _cgroup_pids(top)) and time.monotonic() < deadline:
        _kill_pids(pids)
        time.sleep(0.05)


def _remove_cgroup(top: Path, timeout: float = 5.0) -> None:
    """rmdir a cgroup subtree, deepest first (cgroup dirs can only be rmdir'ed)."""
    deadline = time.monotonic() + timeout
    while top.exists():
        for d in _cgroup_dirs(top):
            try:
                d.rmdir()
            except OSError:
                pass
        if not top.exists() or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if top.exists():
        raise LabError(f"cannot remove cgroup {top}: still has processes {_cgroup_pids(top)}")


def _resolve_inside(root: Path, path: str) -> Path:
    """Resolve `path` as the host would see it, with `root` as its /.

    Plain `root / path` is wrong as soon as a component is an absolute symlink
    (e.g. /etc/localtime), which would then be followed on the lab machine.
    Raises FileNotFoundError when a component is missing.
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        st = os.lstat(candidate)
        if stat_module.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:
                raise OSError(f"too many symlinks resolving {path} in {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def _is_whiteout(st: os.stat_result) -> bool:
    """An overlay whiteout (char device 0:0) in an upper dir means "deleted"."""
    return stat_module.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _write_file(path: Path, data: str, mode: int, uid: int = 0, gid: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.chmod(path, mode)
    os.chown(path, uid, gid)


def _passwd_ids(root: Path, user: str) -> tuple[int, int, str]:
    """(uid, gid, home) of a user from the /etc/passwd under root."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3]), fields[5]
    raise LabError(f"user {user} not found in {root}/etc/passwd")


def default_rootfs() -> Path:
    """The cached Debian rootfs; lab/rootfs.sh builds it once, then prints its path instantly."""
    out = _run(["bash", str(ROOTFS_SCRIPT)]).stdout.strip().splitlines()
    if not out:
        raise LabError(f"{ROOTFS_SCRIPT} printed no rootfs path")
    return Path(out[-1])


# --------------------------------------------------------------------------- Host


@dataclass
class Host:
    """One lab host: a netns with a veth on the lab bridge, an overlay root, and an nspawn.

    A prepared host has its network and directories but is not booted; `start()`
    boots it and returns once sshd sends its banner.

    `segment` says where its legs are (see the module docstring): "main" (eth0 on the
    main bridge), "private" (eth0 on the private segment; `addr` is its private
    address, reachable only through a bastion) or "both" (a bastion: `addr` on the
    main bridge, `private_addr` on eth1).
    """

    lab: Lab = field(repr=False)
    index: int
    hostname: str
    name: str
    addr: str
    upper: Path
    work: Path = field(repr=False)
    root: Path
    console_log: Path = field(repr=False)
    segment: Segment = "main"
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def netns(self) -> str:
        """The network namespace name (same as `name`)."""
        return self.name

    @property
    def veth(self) -> str:
        """The bridge side of the veth pair whose peer is `eth0` in the host's netns.

        For a private host it is in the private segment's netns, not in the root one.
        """
        return self.lab._veth(str(self.index), "private" if self.segment == "private" else "main")

    @property
    def private_addr(self) -> str | None:
        """The host's address on the private segment; None for a host on the main bridge only."""
        return None if self.segment == "main" else self.lab.private_addr(self.index)

    @property
    def cgroups(self) -> tuple[Path, ...]:
        return tuple(cg / f"lg{self.lab.name}" / f"h{self.index}" for cg in CGROUP_ROOTS)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The pid of systemd-nspawn while the host runs."""
        return self._proc.pid if self.running and self._proc else None

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Boot the host and wait until its sshd answers with a banner."""
        with self._lock:
            if self.running:
                return
            self._mount_root()
            self._write_identity()
            self._ensure_host_keys()
            self._proc = self._spawn()
            threading.Thread(
                target=self._supervise, args=(self._proc,), name=f"{self.name}-supervise", daemon=True
            ).start()
        self.wait_for_ssh(timeout)

    def _supervise(self, proc: subprocess.Popen[bytes]) -> None:
        """Boot the host again when its systemd asks for a reboot (`sudo reboot` in the host).

        nspawn does not reboot a container itself: it exits with code 133. A real
        machine comes back after a reboot, and so does a lab host.
        """
        while proc.wait() == NSPAWN_REBOOT_EXIT:
            with self._lock:
                if self._proc is not proc:  # stop() took it: the exit was not a reboot request
                    return
                proc = self._proc = self._spawn()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Power the host off (SIGTERM to nspawn makes systemd shut down cleanly), then unmount its root.

        The network namespace and upper dir stay, so the host can start again.
        """
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for cg in self.cgroups:
                _kill_cgroup(cg)
            for cg in self.cgroups:
                _remove_cgroup(cg)
            if self._root_mounted():
                _umount(self.root)

    def reboot(self) -> None:
        """Stop and start again; the upper dir (everything the host wrote) is kept."""
        self.stop()
        self.start()

    def regenerate_host_keys(self) -> None:
        """Give the host new SSH host keys, as a reinstalled machine would have.

        Stops the host, deletes its keys from the upper dir and starts it again;
        `start()` generates keys for a host that has none. A stopped host stays
        stopped and gets its new keys when it next starts.
        """
        was_running = self.running
        self.stop()
        for key in (self.upper / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        if was_running:
            self.start()

    # ----------------------------------------------------------------- inspection

    def read_file(self, path: str) -> bytes | None:
        """A file's content as the host sees it (merged root) while running, else from the upper dir.

        When the host is stopped only what the host itself wrote is visible, since the upper dir is
        the host's own diff. None when absent (or deleted, for a whiteout).
        """
        found = self._locate(path)
        if found is None:
            return None
        try:
            return found.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def stat(self, path: str) -> os.stat_result | None:
        """os.stat of a path as the host sees it (symlinks resolved inside the host), or None."""
        found = self._locate(path)
        if found is None:
            return None
        try:
            st = os.lstat(found)
        except FileNotFoundError:
            return None
        return None if _is_whiteout(st) else st

    def passive_tcp_opens(self) -> int:
        """TcpPassiveOpens of the host's netns: one per TCP connection the host accepted.

        Tests use it to count the SSH connections a provider opened to this host.
        """
        out = _run([*self._in_netns, "cat", "/proc/net/snmp"]).stdout
        tcp = [line.split()[1:] for line in out.splitlines() if line.startswith("Tcp:")]
        header, values = tcp[0], tcp[1]
        return int(values[header.index("PassiveOpens")])

    def set_link_delay(self, ms: int) -> None:
        """Delay every packet by `ms` in each direction (so the RTT grows by about 2*ms); 0 removes it.

        A netem qdisc goes on both ends of the host's veth: the bridge side (traffic to
        the host) and eth0 in the netns (traffic from the host). Raises NetemUnavailable
        when the kernel lacks sch_netem.
        """
        bridge_side = _nsenter(self.lab.private_netns) if self.segment == "private" else []
        ends: list[list[str]] = [[*bridge_side, "tc"], [*self._in_netns, "tc"]]
        devs = [self.veth, "eth0"]
        for tc, dev in zip(ends, devs, strict=True):
            if ms <= 0:
                _run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
                continue
            proc = _run([*tc, "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{ms}ms"], check=False)
            if proc.returncode != 0:
                err = proc.stderr.strip()
                if "unknown" in err.lower() or "not supported" in err.lower():
                    raise NetemUnavailable(
                        f"cannot delay {self.name}: this kernel has no netem qdisc "
                        f"(CONFIG_NET_SCH_NETEM); tc said: {err}"
                    )
                raise LabError(f"tc qdisc replace dev {dev} netem failed: {err}")

    # ----------------------------------------------------------------- internals

    @property
    def _in_netns(self) -> list[str]:
        """Command prefix to run a short command in the host's netns."""
        return _nsenter(self.netns)

    def _locate(self, path: str) -> Path | None:
        base = self.root if self.running else self.upper
        try:
            found = _resolve_inside(base, path)
            st = os.lstat(found)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if _is_whiteout(st) else found

    def _root_mounted(self) -> bool:
        return any(m == str(self.root) for m, _, _ in _mountinfo())

    def _mount_root(self) -> None:
        for d in (self.upper, self.work, self.root):
            d.mkdir(parents=True, exist_ok=True)
        if self._root_mounted():
            return
        lower = f"{self.lab.base_dir / 'up'}:{self.lab.rootfs_path}"
        opts = f"lowerdir={lower},upperdir={self.upper},workdir={self.work}"
        _run(["mount", "-t", "overlay", self.name, "-o", opts, str(self.root)])

    def _write_identity(self) -> None:
        """Give the host its own name and machine id before it boots.

        Workaround 4: systemd takes the hostname from /etc/hostname, not from --hostname.
        The base layer's /etc/machine-id is empty; left so, systemd derives the id from
        the VM's DMI product UUID, and every host of the lab got the same one. A host
        gets a random id on its first boot and keeps it, like an installed machine.
        """
        etc = self.root / "etc"
        if not (etc / "machine-id").read_text().strip():
            _write_file(etc / "machine-id", secrets.token_hex(16) + "\n", 0o444)
        _write_file(etc / "hostname", f"{self.hostname}\n", 0o644)
        hosts = (
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.hostname}\n{self.addr}\t{self.hostname}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        _write_file(etc / "hosts", hosts, 0o644)

    def _ensure_host_keys(self) -> None:
        """Give the host its own host keys on first boot (the base layer has none).

        Like `ssh-keygen -A`, run in a chroot of the host, but only for the lab's
        `host_key_types`: RSA keygen costs 0.2-3 s of CPU per host (random prime
        search), which made 10 parallel first boots on 2 cores take 17-21 s.
        """
        missing = [t for t in self.lab.host_key_types if not (self.root / f"etc/ssh/ssh_host_{t}_key").exists()]
        if missing:
            script = 'for t; do ssh-keygen -q -t "$t" -N "" -C "root@$HOSTNAME" -f "/etc/ssh/ssh_host_${t}_key"; done'
            _run(["chroot", str(self.root), "env", f"HOSTNAME={self.hostname}", "sh", "-c", script, "keygen", *missing])

    def _spawn(self) -> subprocess.Popen[bytes]:
        for cg in self.cgroups:
            cg.mkdir(parents=True, exist_ok=True)
        Path("/run/systemd").mkdir(parents=True, exist_ok=True)
        nspawn = [
            "systemd-nspawn", "--quiet", "--boot",
            "--directory", str(self.root),
            "--machine", self.name,
            "--hostname", self.hostname,
            "--register=no", "--keep-unit",          # workaround 1
            "--console=pipe",
            f"--network-namespace-path=/run/netns/{self.netns}",
            "--link-journal=no", "--resolv-conf=off", "--timezone=off",
        ]  # fmt: skip
        env = dict(os.environ)
        env["LAB_CGROUPS"] = " ".join(str(cg) for cg in self.cgroups)
        env["LAB_TMPFS"] = f"lg{self.lab.name}run"
        env["LAB_OWN_ROOT"] = str(self.root)
        self.console_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.console_log, "ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            return subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private",
                 "bash", "-c", _NSPAWN_PRELUDE, "lab-nspawn", *nspawn],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip

    def wait_for_ssh(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Wait until the host's sshd sends its banner (e.g. after a reboot from inside the host).

        A private host is asked from its own netns: the root namespace cannot reach it.
        """
        private = self.segment == "private"
        deadline = time.monotonic() + timeout
        while True:
            proc = self._proc
            rc = None if proc is None else proc.poll()
            if proc is None or (rc is not None and rc != NSPAWN_REBOOT_EXIT):  # 133: _supervise boots it again
                raise LabError(f"{self.name} is not running (rc={rc}); console:\n{self._console_tail()}")
            try:
                with (
                    entered_netns(self.netns) if private else contextlib.nullcontext(),
                    socket.create_connection((self.addr, SSH_PORT), timeout=1.0) as sock,
                ):
                    sock.settimeout(max(0.5, deadline - time.monotonic()))
                    if sock.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError(
                    f"{self.name}: no SSH banner from {self.addr} after {timeout}s; console:\n{self._console_tail()}"
                )
            time.sleep(0.05)

    def _console_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.console_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no console log)"


# --------------------------------------------------------------------------- Lab


@dataclass
class Lab:
    """A set of test hosts on one bridge, with every kernel object named after `name`.

    - `name`: 1-3 lowercase letters. Interface names must fit in 15 chars, and
      letters only keep the sweep patterns (`lg<name>h<digits>`) unambiguous.
    - `subnet`: the first three octets of a /24; `.1` is the gateway (the bridge).
    - `private_subnet`: the private segment's /24 (see the module docstring); by
      default `subnet` with its third octet XOR 128 (10.250.0 -> 10.250.128). Made on
      first use, after checking that nothing on the machine routes it yet.
    - `workdir`: key, base layer, host dirs and console logs; kept by teardown.
    - `rootfs`: the Debian tree; by default lab/rootfs.sh's cached one.
    - `host_key_types`: the SSH host keys each host generates on first boot.
      "rsa" is left out by default because its keygen dominates boot time.
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
    def _unreachable_route(self) -> list[str]:
        return ["unreachable", f"{self.private_subnet}.0/24"]

    @property
    def base_dir(self) -> Path:
        return self.workdir / "base"

    @property
    def ssh_key_path(self) -> Path:
        return self.workdir / "ssh" / "id_ed25519"

    @property
    def ssh_private_key(self) -> str:
        return self.ssh_key_path.read_text()

    @property
    def ssh_public_key(self) -> str:
        """The OpenSSH public key line of the lab key."""
        key = serialization.load_ssh_private_key(self.ssh_key_path.read_bytes(), password=None)
        pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        return pub.decode() + f" lab-{self.name}"

    @property
    def pwsudo_password(self) -> str:
        """The password of `pwsudo` (sudo asks for it; SSH password login is off)."""
        return (self.base_dir / "pwsudo-password").read_text().strip()

    @property
    def rootfs_path(self) -> Path:
        if self.rootfs is None:
            self.rootfs = default_rootfs()
        return self.rootfs

    @property
    def _state_file(self) -> Path:
        return self.workdir / "lab-state.json"

    @property
    def _cgroup_tops(self) -> tuple[Path, ...]:
        return tuple(cg / self.prefix for cg in CGROUP_ROOTS)

    def addr(self, index: int) -> str:
        return f"{self.subnet}.{HOST_ADDR_OFFSET + index}"

    def private_addr(self, index: int) -> str:
        """Host `index`'s address on the private segment."""
        return f"{self.private_subnet}.{HOST_ADDR_OFFSET + index}"

    # ----------------------------------------------------------------- setup / teardown

    def setup(self) -> None:
        """Sweep what an earlier run of this lab name left, then create bridge, key and base layer."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.teardown()
        _raise_inotify_limits()
        self._check_subnet_free(self.subnet)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        self._ensure_key()
        self._ensure_base()

    def teardown(self) -> None:
        """Stop everything of this lab and remove its kernel objects; idempotent and crash-safe.

        The workdir (key, base layer, host upper dirs) stays, for inspection and reuse.
        """
        _parallel([h.stop for h in self.hosts.values()])
        for proc in self._extras:
            self._stop_extra(proc)
        self._extras.clear()
        self.hosts.clear()
        self._sweep()

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
        if not 1 <= index <= MAX_HOSTS:
            raise ValueError(f"host index must be 1..{MAX_HOSTS}, got {index}")
        with self._lock:
            host = self.hosts.get(index)
            if host is not None:
                if segment != host.segment:
                    raise ValueError(f"host {index} is on segment {host.segment!r}, not {segment!r}")
                if hostname is not None:
                    host.hostname = hostname
                return host
            hdir = self.workdir / "hosts" / str(index)
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
        if host.netns not in _netns_list():
            self._add_netns(host.netns, str(index), HOST_ADDR_OFFSET + index, segment)
        for d in (host.upper, host.work, host.root):
            d.mkdir(parents=True, exist_ok=True)
        return host

    def boot(self, n: int, start: int = 1) -> list[Host]:
        """Prepare and start hosts start..start+n-1 in parallel; return them once every sshd answers."""

        def one(i: int) -> Host:
            host = self.prepare(i)
            host.start()
            return host

        return _parallel([functools.partial(one, i) for i in range(start, start + n)])

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
        self._remember("extra_netns", netns)
        if netns not in _netns_list():
            self._add_netns(netns, netns_suffix, addr_index, segment)
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
        wrapped = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _EXTRA_PRELUDE, "lab-extra",
                   "ip", "netns", "exec", netns, *argv]  # fmt: skip
        proc: subprocess.Popen[bytes] = subprocess.Popen(wrapped, **popen_kwargs)
        self._extras.append(proc)
        return proc

    # ----------------------------------------------------------------- internals

    def _check_subnet_free(self, subnet: str) -> None:
        """Refuse a subnet whose gateway address another interface (another lab?) already has,
        or that the root namespace already routes (another lab's bridge or private segment)."""
        gateway = f"{subnet}.1"
        out = _run(["ip", "-o", "-4", "addr", "show"]).stdout
        for line in out.splitlines():
            fields = line.split()
            if fields[3].split("/")[0] == gateway:
                raise LabError(f"{gateway} is already on {fields[1]}; pick another subnet for lab {self.name}")
        routes = _run(["ip", "-o", "route", "show", "table", "all", "root", f"{subnet}.0/24"]).stdout.strip()
        if routes:
            raise LabError(f"{subnet}.0/24 is already routed ({routes.splitlines()[0]}); "
                           f"pick another subnet for lab {self.name}")  # fmt: skip

    def _veth(self, key: str, segment: Literal["main", "private"]) -> str:
        """The bridge side of a veth: in the root namespace for main, in `private_netns` for private."""
        return f"{self.prefix}v{key}" if segment == "main" else f"v{key}"

    def _ensure_private_segment(self) -> None:
        """Create the private segment (its netns, bridge and unreachable route) on first use."""
        with self._lock:
            if self.private_netns in _netns_list():
                return
            self._check_subnet_free(self.private_subnet)
            self._remember("routes", " ".join(self._unreachable_route))
            _run(["ip", "route", "add", *self._unreachable_route])
            _run(["ip", "netns", "add", self.private_netns])
            for cmd in (["link", "add", "name", "br0", "type", "bridge"], ["link", "set", "dev", "br0", "up"]):
                _run(["ip", "-n", self.private_netns, *cmd])

    def _add_netns(self, netns: str, key: str, addr_index: int, segment: Segment) -> None:
        """A netns with eth0 on the main bridge or the private segment; for "both", eth0 main and eth1 private."""
        legs: list[tuple[list[str], str, str, str]] = []  # (ip option for the bridge side, veth, bridge, subnet)
        if segment != "private":
            legs.append(([], self._veth(key, "main"), self.bridge, self.subnet))
        if segment != "main":
            self._ensure_private_segment()
            legs.append((["-n", self.private_netns], self._veth(key, "private"), "br0", self.private_subnet))
        _run(["ip", "netns", "add", netns])
        for n, (side, veth, bridge, subnet) in enumerate(legs):
            _run(["ip", *side, "link", "add", "name", veth, "type", "veth", "peer", "name", f"eth{n}", "netns", netns])
            _run(["ip", *side, "link", "set", "dev", veth, "master", bridge, "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{subnet}.{addr_index}/24", "dev", f"eth{n}"])
            _run(["ip", "-n", netns, "link", "set", f"eth{n}", "up"])
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])

    def _remember(self, kind: Literal["extra_netns", "routes"], item: str) -> None:
        """Record extra netns names and root-namespace routes on disk, so a setup after a crash can find them."""
        state = self._read_state()
        if item not in state[kind]:
            state[kind].append(item)
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._state_file.write_text(json.dumps(state))

    def _read_state(self) -> dict[str, list[str]]:
        try:
            state: dict[str, list[str]] = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            state = {}
        state.setdefault("extra_netns", [])
        state.setdefault("routes", [])
        return state

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

    def _own_netns(self) -> list[str]:
        """This lab's netns: hosts by name, extras from the state file or from their veth.

        An extra's name alone is ambiguous between labs (lab "x" with suffix "yrepo"
        and lab "xy" with "repo" both give "lgxyrepo"), so an extra counts as ours only
        when recorded in this workdir or when its veth is on our bridge, has our veth
        name or is on our private segment; the veth tells which netns its peer is in.
        The private segment's netns is ours by its name (lab names have no "-").
        """
        existing = _netns_list()
        host_re = re.compile(rf"{self.prefix}h\d+")
        own = {ns for ns in existing if host_re.fullmatch(ns) or ns == self.private_netns}
        own |= set(self._read_state()["extra_netns"]) & set(existing)
        veth_re = re.compile(rf"\d+: {self.prefix}v[a-z0-9]+@")
        lines = _run(["ip", "-o", "link", "show"]).stdout.splitlines()
        veths = [line for line in lines if veth_re.match(line) or f" master {self.bridge} " in line]
        if self.private_netns in existing:  # every veth on the private segment is ours
            veths += _run([*_nsenter(self.private_netns), "ip", "-o", "link", "show"]).stdout.splitlines()
        for line in veths:
            peer = re.search(r" link-netns (\S+)", line)
            if peer and peer.group(1) in existing:
                own.add(peer.group(1))
        return sorted(own)

    def _sweep(self) -> None:
        """Remove every kernel object of this lab name, including leftovers of a killed run.

        Order matters: processes first (a netns whose processes live on keeps its veth,
        and a busy mount cannot be unmounted), then mounts, netns, links, cgroups.
        """
        # nspawn processes of an earlier run of this workdir; they are not our children.
        needle = str(self.workdir).encode()
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if b"systemd-nspawn" in cmdline and needle in cmdline:
                _kill_pids([int(pid_dir.name)])
        for top in self._cgroup_tops:
            _kill_cgroup(top)
        own_netns = self._own_netns()
        for ns in own_netns:
            pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            _kill_pids(int(p) for p in pids)
        # Mounts: host roots and the base-layer build mount, found by their source tag or place.
        tag = re.compile(rf"{self.prefix}(h\d+|base)")
        inside = str(self.workdir) + "/"
        ours = [m for m, fs, src in _mountinfo() if (fs == "overlay" and tag.fullmatch(src)) or m.startswith(inside)]
        for mountpoint in sorted(set(ours), key=len, reverse=True):
            _umount(Path(mountpoint))
        routes = set(self._read_state()["routes"])  # only routes this lab made: another lab may use the subnet
        if self.private_netns in own_netns:  # made just after its route
            routes.add(" ".join(self._unreachable_route))
        for ns in own_netns:
            _run(["ip", "netns", "del", ns], check=False)
        link_re = re.compile(rf"{self.prefix}v\w+|{self.prefix}br")
        for link in _link_names():
            if link_re.fullmatch(link):
                _run(["ip", "link", "del", link], check=False)
        for route in routes:
            _run(["ip", "route", "del", *route.split()], check=False)
        for top in self._cgroup_tops:
            _remove_cgroup(top)
        self._state_file.unlink(missing_ok=True)

    def _ensure_key(self) -> None:
        """Generate the lab's ed25519 key once per workdir (OpenSSH format, 0600)."""
        path = self.ssh_key_path
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ed25519.Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        tmp.rename(path)
        path.with_suffix(".pub").write_text(self.ssh_public_key + "\n")

    def _ensure_base(self) -> None:
        """Build the shared base layer once per workdir (rebuilt when missing or stale).

        The stamp ties it to the rootfs, the lab key and the recipe version: the
        authorized_keys files in it hold this workdir's key.
        """
        stamp = self.base_dir / "stamp.json"
        want = {
            "version": BASE_VERSION,
            "rootfs": str(self.rootfs_path),
            "key": self.ssh_public_key,
            "host_key_types": list(self.host_key_types),
        }
        try:
            if json.loads(stamp.read_text()) == want and (self.base_dir / "up").is_dir():
                return
        except (OSError, ValueError):
            pass
        shutil.rmtree(self.base_dir, ignore_errors=True)
        up, wk, mnt = (self.base_dir / d for d in ("up", "wk", "mnt"))
        for d in (up, wk, mnt):
            d.mkdir(parents=True)
        opts = f"lowerdir={self.rootfs_path},upperdir={up},workdir={wk}"
        _run(["mount", "-t", "overlay", f"{self.prefix}base", "-o", opts, str(mnt)])
        try:
            self._configure_base(mnt)
        finally:
            _umount(mnt)
        shutil.rmtree(wk, ignore_errors=True)
        mnt.rmdir()
        stamp.write_text(json.dumps(want))

    def _configure_base(self, root: Path) -> None:
        """Users, sudo rules, sshd settings and unit masks shared by every host."""
        password = secrets.token_urlsafe(18)
        for user in USERS:
            _run(["chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", user])
        _run(["chroot", str(root), "chpasswd"], input=f"pwsudo:{password}\n")
        _write_file(self.base_dir / "pwsudo-password", password + "\n", 0o600)
        _write_file(root / "etc/sudoers.d/deploy", "deploy ALL=(ALL) NOPASSWD:ALL\n", 0o440)
        _write_file(root / "etc/sudoers.d/pwsudo", "pwsudo ALL=(ALL) ALL\n", 0o440)
        pub = self.ssh_public_key + "\n"
        for user in USERS:
            uid, gid, home = _passwd_ids(root, user)
            ssh_dir = root / home.lstrip("/") / ".ssh"
            ssh_dir.mkdir(mode=0o700, exist_ok=True)
            os.chown(ssh_dir, uid, gid)
            _write_file(ssh_dir / "authorized_keys", pub, 0o600, uid, gid)
        # Name the host keys, so sshd does not complain about the types the lab does not generate.
        host_keys = "".join(f"HostKey /etc/ssh/ssh_host_{t}_key\n" for t in self.host_key_types)
        _write_file(root / "etc/ssh/sshd_config.d/lab.conf", SSHD_DROPIN + host_keys, 0o644)
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        _write_file(root / "etc/machine-id", "", 0o444)
        _write_file(root / "etc/systemd/journald.conf.d/lab.conf", JOURNALD_DROPIN, 0o644)
        units = root / "etc/systemd/system"
        for unit in MASKED_UNITS:
            link = units / unit
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to("/dev/null")
        for wants in units.glob("*.wants/*"):
            if wants.name in MASKED_UNITS:
                wants.unlink()
