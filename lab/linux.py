"""Linux primitives the lab is built from: commands, mounts, network namespaces, cgroups, files in a host's root.

Nothing here knows about hosts or labs; lab/host.py and lab/hosts.py compose these.
docs/test-hosts.md explains why each is needed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat as stat_module
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
CLONE_NEWNET = 0x40000000


class LabError(RuntimeError):
    """A lab operation failed; the message says which command and why."""


class NetemUnavailable(LabError):
    """The kernel has no `netem` qdisc, so link delay cannot be emulated."""


T = TypeVar("T")


# --------------------------------------------------------------------------- helpers


def run(argv: Sequence[str], *, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output, and raise LabError with its stderr on failure."""
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed (rc={proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def parallel(fns: Iterable[Callable[[], T]]) -> list[T]:
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


def raise_inotify_limits() -> None:
    """Every container's systemd and journald take inotify instances from root's share.

    With the kernel default of 128 instances per user, about 30 hosts exhaust
    it and the next systemd-nspawn exits 255 without a word (inotify_init1:
    EMFILE). Raise the limits; never lower them.
    """
    for name, want in INOTIFY_LIMITS.items():
        _raise_sysctl(Path("/proc/sys/fs/inotify") / name, want)


NEIGH_PER_HOST = 4
"""Neighbour (ARP) entries one lab host accounts for: its own entries for the gateway and the release server's
address, and the entries the gateway and the release server's namespace hold for it."""
NEIGH_SYSCTLS = Path("/proc/sys/net/ipv4/neigh/default")
BACKLOG_SYSCTL = Path("/proc/sys/net/core/netdev_max_backlog")
BACKLOG_PER_HOST = 4
"""Packets a broadcast on the lab bridge queues per host: one copy per port, a few broadcasts at once."""


def raise_neighbour_limits(hosts: int) -> None:
    """The kernel has one ARP table for every network namespace, and refuses new entries beyond gc_thresh3
    (1,024 by default): with ~250 lab hosts or more it logs "neighbor table overflow" and connections to new
    neighbours fail (the benchmark's 500- and 1,000-node fleets). Raise the three thresholds so that
    NEIGH_PER_HOST entries per host stay below the first (no garbage collection at all); never lower them."""
    want = NEIGH_PER_HOST * hosts
    for name, value in (("gc_thresh1", want), ("gc_thresh2", 2 * want), ("gc_thresh3", 4 * want)):
        _raise_sysctl(NEIGH_SYSCTLS / name, value)


def raise_backlog_limit(hosts: int) -> None:
    """A broadcast on the lab bridge (an ARP request of the machine's side) is copied to every port, and each
    copy waits in this CPU's input queue of `netdev_max_backlog` packets (1,000 by default) before the host's
    netns takes it; the copies beyond are dropped. With 1,010 hosts on the bridge, the hosts of the first ports
    (the last to get their copy) never saw an ARP request for them and could not be reached. Raise the queue to
    BACKLOG_PER_HOST packets per host; never lower it."""
    _raise_sysctl(BACKLOG_SYSCTL, BACKLOG_PER_HOST * hosts)


def _raise_sysctl(path: Path, value: int) -> None:
    """Set an integer sysctl to `value` if it is lower; a higher one (another lab's, the admin's) stays."""
    if int(path.read_text()) < value:
        path.write_text(str(value))


def mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, fs type, source) of every mount in our mount namespace."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        mountpoint = pre.split()[4].replace("\\040", " ")
        fstype, source = (post.split() + ["", ""])[:2]
        mounts.append((mountpoint, fstype, source))
    return mounts


def is_mounted(path: Path) -> bool:
    """Whether something is mounted at `path` in our mount namespace."""
    return any(m == str(path) for m, _, _ in mountinfo())


def umount(path: Path) -> None:
    """Unmount, retrying briefly when busy, and fall back to a lazy unmount."""
    for _ in range(20):
        if run(["umount", str(path)], check=False).returncode == 0:
            return
        if not is_mounted(path):
            return
        time.sleep(0.05)
    run(["umount", "-l", str(path)], check=False)


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


def nsenter(netns: str) -> list[str]:
    """Command prefix to run a short command in a netns.

    nsenter joins only the netns; `ip netns exec` would also make a mount namespace
    copy holding every host's overlay (see lab/host.py's DETACH_LAB_MOUNTS).
    """
    return ["nsenter", f"--net=/run/netns/{netns}"]


def netns_list() -> list[str]:
    return [line.split()[0] for line in run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]


def link_names() -> list[str]:
    out = run(["ip", "-o", "link", "show"]).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()]


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def cgroup_dirs(top: Path) -> list[Path]:
    """Every cgroup directory under top (top included), deepest first."""
    if not top.is_dir():
        return []
    dirs = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(top: Path) -> list[int]:
    pids: list[int] = []
    for d in cgroup_dirs(top):
        try:
            pids += [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except OSError:
            pass
    return pids


def kill_cgroup(top: Path, timeout: float = 10.0) -> None:
    """SIGKILL everything in a cgroup subtree until it is empty.

    Needed after a crash: a SIGKILLed nspawn leaves the container's systemd
    running, reparented, in the container's cgroup.
    """
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(top)) and time.monotonic() < deadline:
        kill_pids(pids)
        time.sleep(0.05)


def remove_cgroup(top: Path, timeout: float = 120.0) -> None:
    """rmdir a cgroup subtree, deepest first (cgroup dirs can only be rmdir'ed).

    A killed process leaves cgroup.procs before it has exited, and the cgroup stays busy until it has: with a
    thousand hosts stopping at once on 2 CPUs, 5 s and then 30 s were too short, and teardown failed on a cgroup
    that listed no process."""
    deadline = time.monotonic() + timeout
    while top.exists():
        for d in cgroup_dirs(top):
            try:
                d.rmdir()
            except OSError:
                pass
        if not top.exists() or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if top.exists():
        raise LabError(f"cannot remove cgroup {top}: still has processes {cgroup_pids(top)}")


def resolve_inside(root: Path, path: str) -> Path:
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


def is_whiteout(st: os.stat_result) -> bool:
    """An overlay whiteout (char device 0:0) in an upper dir means "deleted"."""
    return stat_module.S_ISCHR(st.st_mode) and st.st_rdev == 0


def write_file(path: Path, data: str, mode: int, uid: int = 0, gid: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.chmod(path, mode)
    os.chown(path, uid, gid)


def passwd_ids(root: Path, user: str) -> tuple[int, int, str]:
    """(uid, gid, home) of a user from the /etc/passwd under root."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3]), fields[5]
    raise LabError(f"user {user} not found in {root}/etc/passwd")
