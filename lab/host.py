"""One lab host: a systemd-nspawn container booting systemd from an overlay root, in a network namespace of its own.

How it boots, and why each workaround is needed: docs/test-hosts.md.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lab import light, linux
from lab.linux import LabError, NetemUnavailable

if TYPE_CHECKING:
    from lab.hosts import Lab

SSH_PORT = 22
BOOT_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
NSPAWN_REBOOT_EXIT = 133  # systemd-nspawn's exit code when the container asked for a reboot

#: Where a host or extra netns has its legs: the main bridge, the private segment, or both (a bastion).
Segment = Literal["main", "private", "both"]

# Shell code run first in every private mount namespace the lab starts a
# long-lived process in. Such a namespace begins as a copy of the root one, with
# every lab host's overlay mount in it; while a copy lives, a host that stops and
# starts again finds its upper dir "in use by another mount" (overlayfs warns:
# accessing files from both mounts will result in undefined behavior). So drop
# the copies, except the host's own root ($LAB_OWN_ROOT).
#
# Workaround 5: every host root lies under the lab's hosts dir, a mount of its own
# ($LAB_HOSTS_MNT, `Lab.setup`), so one lazy unmount of it drops every copy at
# once. Dropping them one by one cost a syscall and an RCU grace period each, and
# booting N hosts was quadratic in N (45 s per start with 770 hosts running). The
# own root is first bound to a place outside it, in this namespace's tmpfs on
# /run/systemd, and moved back after. The awk pass then finds only what lies
# elsewhere: the base layer's build mount, or every root of a lab set up before
# the hosts dir was a mount.
DETACH_LAB_MOUNTS = r"""
if [ -n "${LAB_HOSTS_MNT:-}" ] && mountpoint -q "$LAB_HOSTS_MNT"; then
    if [ -n "${LAB_OWN_ROOT:-}" ]; then
        mkdir -p /run/systemd/lab-own-root
        mount --bind "$LAB_OWN_ROOT" /run/systemd/lab-own-root
    fi
    umount -l "$LAB_HOSTS_MNT"
    if [ -n "${LAB_OWN_ROOT:-}" ]; then
        mount --move /run/systemd/lab-own-root "$LAB_OWN_ROOT"
    fi
fi
awk -v own="${LAB_OWN_ROOT:-}" '{
    for (i = 7; i <= NF && $i != "-"; i++) ;
    if ($(i+1) == "overlay" && $(i+2) ~ /^lg[a-z]+(h[0-9]+|base)$/ && $5 != own) print $5
}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" || true; done
"""

# Runs inside `unshare --mount --propagation private`, as the process that then
# becomes systemd-nspawn (exec keeps the pid, so Popen.pid is the nspawn pid).
NSPAWN_PRELUDE = (
    "set -eu\n"
    'for cg in $LAB_CGROUPS; do echo $$ > "$cg/cgroup.procs"; done  # workaround 3\n'
    "# Workaround 2: nspawn needs /run/systemd/nspawn on a tmpfs. Mounting it over\n"
    "# /run/systemd, in this namespace only, leaves nothing behind in the machine's /run.\n"
    'mount -t tmpfs -o mode=0755,size=16m "$LAB_TMPFS" /run/systemd\n'
    + DETACH_LAB_MOUNTS
    + "mkdir -p /run/systemd/nspawn\n"
    'exec "$@"\n'
)

# The same for a process started in an extra netns (`ip netns exec` makes yet another
# mount namespace, a copy of this cleaned one).
EXTRA_PRELUDE = DETACH_LAB_MOUNTS + 'exec "$@"\n'


SYSTEM_CAS_NOTE = "# lab: only the first system CAs are trusted (Lab.system_cas)"


def trust_first_system_cas(root: Path, keep: int) -> None:
    """Make the /etc/ca-certificates.conf under ``root`` list only its first ``keep`` system CAs.

    update-ca-certificates then puts ``keep`` system CAs (and the local ones, such as the cluster's root) in the
    bundle instead of all ~140, each of which costs it a few processes, in every onboarding. Applying it again
    changes nothing.
    """
    conf = root / "etc" / "ca-certificates.conf"
    lines = conf.read_text().splitlines()
    comments = [line for line in lines if line.startswith("#") and line != SYSTEM_CAS_NOTE]
    cas = [line for line in lines if line and not line.startswith(("#", "!"))][:keep]
    conf.write_text("\n".join([*comments, SYSTEM_CAS_NOTE, *cas]) + "\n")
    os.chmod(conf, 0o644)
    os.chown(conf, 0, 0)


@dataclass
class Host:
    """One lab host: a netns with a veth on the lab bridge, an overlay root, and an nspawn.

    A prepared host has its network and directories but is not booted; `start()`
    boots it and returns once sshd sends its banner.

    `segment` says where its legs are (docs/test-hosts.md, "Network"): "main" (eth0 on the
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
        return tuple(cg / f"lg{self.lab.name}" / f"h{self.index}" for cg in linux.CGROUP_ROOTS)

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
            if self.lab.system_cas is not None:
                trust_first_system_cas(self.root, self.lab.system_cas)
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
                linux.kill_cgroup(cg)
            for cg in self.cgroups:
                linux.remove_cgroup(cg)
            if self._root_mounted():
                linux.umount(self.root)

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
        return None if linux.is_whiteout(st) else st

    def passive_tcp_opens(self) -> int:
        """TcpPassiveOpens of the host's netns: one per TCP connection the host accepted.

        Tests use it to count the SSH connections a provider opened to this host.
        """
        out = linux.run([*self._in_netns, "cat", "/proc/net/snmp"]).stdout
        tcp = [line.split()[1:] for line in out.splitlines() if line.startswith("Tcp:")]
        header, values = tcp[0], tcp[1]
        return int(values[header.index("PassiveOpens")])

    def set_link_delay(self, ms: int) -> None:
        """Delay every packet by `ms` in each direction (so the RTT grows by about 2*ms); 0 removes it.

        A netem qdisc goes on both ends of the host's veth: the bridge side (traffic to
        the host) and eth0 in the netns (traffic from the host). Raises NetemUnavailable
        when the kernel lacks sch_netem.
        """
        bridge_side = linux.nsenter(self.lab.private_netns) if self.segment == "private" else []
        ends: list[list[str]] = [[*bridge_side, "tc"], [*self._in_netns, "tc"]]
        devs = [self.veth, "eth0"]
        for tc, dev in zip(ends, devs, strict=True):
            if ms <= 0:
                linux.run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
                continue
            proc = linux.run([*tc, "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{ms}ms"], check=False)
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
        return linux.nsenter(self.netns)

    def _locate(self, path: str) -> Path | None:
        base = self.root if self.running else self.upper
        try:
            found = linux.resolve_inside(base, path)
            st = os.lstat(found)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if linux.is_whiteout(st) else found

    def _root_mounted(self) -> bool:
        return linux.is_mounted(self.root)

    def _mount_root(self) -> None:
        for d in (self.upper, self.work, self.root):
            d.mkdir(parents=True, exist_ok=True)
        if self._root_mounted():
            return
        lower = f"{self.lab.base_dir / 'up'}:{self.lab.rootfs_path}"
        opts = f"lowerdir={lower},upperdir={self.upper},workdir={self.work}"
        linux.run(["mount", "-t", "overlay", self.name, "-o", opts, str(self.root)])

    def _write_identity(self) -> None:
        """Give the host its own name and machine id before it boots.

        Workaround 4: systemd takes the hostname from /etc/hostname, not from --hostname.
        The base layer's /etc/machine-id is empty; left so, systemd derives the id from
        the VM's DMI product UUID, and every host of the lab got the same one. A host
        gets a random id on its first boot and keeps it, like an installed machine.
        """
        etc = self.root / "etc"
        if not (etc / "machine-id").read_text().strip():
            linux.write_file(etc / "machine-id", secrets.token_hex(16) + "\n", 0o444)
        linux.write_file(etc / "hostname", f"{self.hostname}\n", 0o644)
        hosts = (
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.hostname}\n{self.addr}\t{self.hostname}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        linux.write_file(etc / "hosts", hosts, 0o644)

    def _ensure_host_keys(self) -> None:
        """Give the host its own host keys on first boot (the base layer has none).

        Like `ssh-keygen -A`, run in a chroot of the host, but only for the lab's
        `host_key_types`: RSA keygen costs 0.2-3 s of CPU per host (random prime
        search), which made 10 parallel first boots on 2 cores take 17-21 s.
        """
        missing = [t for t in self.lab.host_key_types if not (self.root / f"etc/ssh/ssh_host_{t}_key").exists()]
        if missing:
            script = 'for t; do ssh-keygen -q -t "$t" -N "" -C "root@$HOSTNAME" -f "/etc/ssh/ssh_host_${t}_key"; done'
            linux.run(["chroot", str(self.root), "env", f"HOSTNAME={self.hostname}", "sh", "-c", script, "keygen", *missing])

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
        env["LAB_HOSTS_MNT"] = str(self.lab.hosts_dir)
        self.console_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.console_log, "ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            return subprocess.Popen(
                [*(light.exec_prefix() if self.lab.light else []), "unshare", "--mount", "--propagation", "private",
                 "bash", "-c", NSPAWN_PRELUDE, "lab-nspawn", *nspawn],
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
                    linux.entered_netns(self.netns) if private else contextlib.nullcontext(),
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
