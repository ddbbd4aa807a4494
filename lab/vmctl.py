"""vmctl: the lab's VM command line, called the way an operator calls a hypervisor or cloud CLI.

    python -m lab.vmctl boot    --lab NAME --subnet 10.x.y --index N --hostname H [--image IMAGE]
    python -m lab.vmctl stop    --lab NAME --subnet 10.x.y --index N
    python -m lab.vmctl reimage --lab NAME --subnet 10.x.y --index N --hostname H [--image IMAGE]

`boot` and `reimage` print the VM as JSON on stdout once its sshd answers:
{"address": "10.x.y.(20+N)", "hostname": H, "index": N, "image": IMAGE}.

A VM is host N of a lab that another process set up and owns (the test
session: bridge, base layer, teardown); vmctl only attaches to it, so it runs
from any process, e.g. a `pulumi_command.local.Command`.

- `boot` leaves a small supervisor process behind, in a session of its own
  with no terminal or pipe of the caller's: it starts the host's
  systemd-nspawn, boots it again after a `reboot` inside the VM (as Lab
  does for its hosts) and reaps it when it powers off, so the VM keeps
  running after vmctl exits. `stop` finds the nspawn again by its command
  line (its machine name and root directory) and powers it off.
- The disk is the host's overlay upper dir. `boot --image X` records X beside
  it; booting a disk made from another image re-images it first, as
  `reimage` always does: the disk is wiped, so the machine comes back at the
  same address with new SSH host keys, a new machine id and nothing the old
  one wrote.
- Every stop appends one JSON line to `<lab workdir>/hosts/<N>/stops.jsonl`:
  whether the VM was running and which llmgw paths existed at that moment, so
  a test can prove a node's files were removed before its VM went down.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab.hosts import Host, Lab, LabError

CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))

#: What a stop records about the VM's disk at that moment.
WATCHED_PATHS = ("/etc/llmgw", "/usr/local/bin/llmgw", "/etc/systemd/system/llmgw-agent.service")


class _Adopted:
    """A systemd-nspawn that another process started: the part of Popen that Host uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not _alive(self.pid):
            self.returncode = 0  # not our child: its exit status is not ours to read
        return self.returncode

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        return rc


def _alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie waits for whoever inherited it to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes() -> Iterator[tuple[int, int, list[bytes]]]:
    """(pid, parent pid, argv) of every live process."""
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            ppid = int((pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if _alive(int(pid_dir.name)):
            yield int(pid_dir.name), ppid, argv


def nspawn_pid(host: Host) -> int | None:
    """The pid of the systemd-nspawn running this host, found by its command line (machine name and root)."""
    found = {pid: ppid for pid, ppid, argv in processes()
             if os.path.basename(argv[0]) == b"systemd-nspawn"
             and host.name.encode() in argv and str(host.root).encode() in argv}
    # nspawn forks the container's init, which shows nspawn's command line until it execs.
    top = [pid for pid, ppid in found.items() if ppid not in found]
    return min(top) if top else None


def attach(args: argparse.Namespace) -> Host:
    """Host `index` of the running lab, with its nspawn adopted when it is up."""
    workdir = Path(args.workdir or CACHE / f"lab-{args.lab}")
    try:
        stamp = json.loads((workdir / "base" / "stamp.json").read_text())
    except (OSError, ValueError):
        raise LabError(f"lab {args.lab} has no base layer in {workdir}: set the lab up first") from None
    lab = Lab(name=args.lab, subnet=args.subnet, workdir=workdir, rootfs=Path(stamp["rootfs"]),
              host_key_types=tuple(stamp["host_key_types"]))
    if args.subnet != (lab_subnet := _bridge_subnet(lab)):
        raise LabError(f"lab {args.lab} is on {lab_subnet}, not {args.subnet}")
    host = lab.prepare(args.index, getattr(args, "hostname", None))
    pid = nspawn_pid(host)
    if pid is not None:
        host._proc = _Adopted(pid)  # type: ignore[assignment]
    return host


def _bridge_subnet(lab: Lab) -> str | None:
    """The /24 the lab's bridge serves (None when the lab is not set up)."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", lab.bridge], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        return line.split()[3].split("/")[0].rsplit(".", 1)[0]
    return None


def _image_file(host: Host) -> Path:
    return host.upper.parent / "image"


def _wipe(host: Host) -> None:
    """A fresh disk: the host's own layer goes, the shared base and rootfs stay."""
    for d in (host.upper, host.work):
        shutil.rmtree(d, ignore_errors=True)
    _image_file(host).unlink(missing_ok=True)


def _record_stop(host: Host) -> None:
    running = host.running
    record: dict[str, Any] = {"at": time.time(), "running": running}
    if running:  # the merged root is the VM's file system as it sees it right now
        record["paths"] = {p: (host.root / p.lstrip("/")).exists() for p in WATCHED_PATHS}
        etc = host.root / "etc/llmgw"
        record["etc_llmgw"] = sorted(os.listdir(etc)) if etc.is_dir() else None
    with open(host.upper.parent / "stops.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def stop(host: Host) -> None:
    _record_stop(host)
    host.stop()


def boot(host: Host, image: str | None, reimage: bool = False) -> dict[str, Any]:
    recorded = _image_file(host).read_text().strip() if _image_file(host).exists() else None
    if reimage or (image is not None and recorded is not None and recorded != image):
        stop(host)
        _wipe(host)
    if not host.running:
        _start_detached(host)
    host.wait_for_ssh()
    image = image or recorded
    if image is not None:
        _image_file(host).write_text(image + "\n")
    return {"address": host.addr, "hostname": host.hostname, "index": host.index, "image": image}


def _start_detached(host: Host) -> None:
    """Start the host from a forked supervisor that outlives this process; return once nspawn runs."""
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:  # the supervisor
        os.close(ready_r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        status = 0
        try:
            host.start(timeout=0)
        except LabError:
            pass  # no banner yet: the caller waits for it
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, then this process ends
            os.write(ready_w, f"{type(exc).__name__}: {exc}".encode())
            status = 1
        os.close(ready_w)
        if status == 0:
            for t in threading.enumerate():
                if t.name == f"{host.name}-supervise":
                    t.join()  # ends when nspawn exits other than for a reboot
        os._exit(status)
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as r:
        error = r.read().decode()
    if error:
        raise LabError(f"{host.name} did not start: {error}")
    deadline = time.monotonic() + 10  # until the prelude has exec'ed systemd-nspawn
    while (pid := nspawn_pid(host)) is None:
        if time.monotonic() > deadline:
            raise LabError(f"{host.name} did not start; console:\n{host._console_tail()}")
        time.sleep(0.05)
    host._proc = _Adopted(pid)  # type: ignore[assignment]


def parse(argv: list[str]) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--lab", required=True, help="the lab's name (1-3 letters)")
    common.add_argument("--subnet", required=True, help="the lab's /24, as three octets")
    common.add_argument("--index", required=True, type=int, help="the VM: host N gets <subnet>.(20+N)")
    common.add_argument("--workdir", help="the lab's workdir (default: $LLMGW_CACHE/lab-<lab>)")
    parser = argparse.ArgumentParser(prog="python -m lab.vmctl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("boot", "reimage"):
        p = sub.add_parser(name, parents=[common])
        p.add_argument("--hostname", required=True)
        p.add_argument("--image", help="the image the VM's disk is made from")
    sub.add_parser("stop", parents=[common])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        host = attach(args)
        if args.command == "stop":
            stop(host)
        else:
            print(json.dumps(boot(host, args.image, reimage=args.command == "reimage")), flush=True)
    except LabError as exc:
        print(f"vmctl {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
