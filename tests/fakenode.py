"""A fake node: the package's real scripts, run with `sh` on this machine under a temporary root.

``FakeNodes`` is a ``sessions.Nodes``: install it with ``sessions.use(FakeNodes(node))``
and the providers' create, update, read and delete run against ``FakeNode``s
instead of SSH. No root, no SSH, no network:

- every path a script touches is under ``node.root``: the scripts prefix their
  paths with ``$R``, which prelude.sh sets empty; this harness, which builds the
  program text, replaces that one line with the fake root (``with_root``).
  Nothing in the environment moves the root, so nothing on a real node can;
- the commands that need root or a real machine are stand-ins on PATH, which
  keep their state under ``node.state`` and log every call (``node.calls()``):
  ``sudo`` (runs its command), ``chown`` (records owner, and the mode and size
  the file had at that moment, instead of changing anything: ``node.chowns``),
  ``stat`` (the real one, with the owners chown recorded; root:root otherwise,
  as for anything a root script creates), ``systemctl`` and ``journalctl``
  (see below), ``update-ca-certificates`` (recorded; fails while
  ``node.fail_trust_update`` is set), ``dpkg`` and ``hostname`` (the node's
  architecture and hostname), ``curl`` (serves ``release_url`` from
  ``node.releases``), ``sleep`` (returns at once);
- the fake systemd: ``start``/``restart`` run the unit file's ExecStart once
  (its executable under the root). Exit 0 means the service came up and stays
  ``active``; anything else is a crash: its stderr goes to the unit's journal
  and the unit shows ``activating`` (auto-restart), as Restart=on-failure does.

Each ``run`` gets the command line transport would send (``sudo -n -- sh -c
TEXT sh ARGS...``, shell-quoted) and runs it with ``sh -c``, feeding the
script's stdin. ``FakeNode(..., without=("flock",))`` is a node that lacks those
commands: its PATH has every other command of this machine's, not those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_pulumi import errors
from llmgw_pulumi.nodestate.commands import Script
from llmgw_pulumi.ssh import sessions
from llmgw_pulumi.ssh.connection import stdin_chunks

RELEASE_URL = "https://releases.fake.test/llmgw"

ROOT_LINE = "\nR=''\n"
"""The line of prelude.sh that sets the root of every path the scripts touch: empty, the node's own /."""


def with_root(text: str, root: Path) -> str:
    """A program's text with its root moved to ``root`` (the one test hook, see prelude.sh)."""
    if text.count(ROOT_LINE) != 1:
        raise AssertionError(f"prelude.sh must set the root in exactly one line {ROOT_LINE.strip()!r}")
    return text.replace(ROOT_LINE, f"\nR={shlex.quote(str(root))}\n")

_REAL = {name: shutil.which(name) or f"/usr/bin/{name}" for name in ("stat", "cp")}

_STANDINS: dict[str, str] = {
    "sudo": r"""
log sudo "$1" "$2"
while [ $# -gt 0 ]; do case $1 in -n) shift ;; --) shift; break ;; *) break ;; esac; done
exec "$@"
""",
    "chown": r"""
log chown "$@"
owner=$1; shift
for f in "$@"; do
  printf '%s %s %s\n' "$(REAL_STAT -c '%i' "$f")" "$owner" "$(REAL_STAT -c '%a %s' "$f")" | tr -d '\n' >> "$FAKE_STATE/owners"
  printf ' %s\n' "$f" >> "$FAKE_STATE/owners"
done
""",
    "stat": r"""
# stat -c FORMAT PATH...: the real stat, with the owner chown recorded for the file's inode.
[ "$1" = -c ] || exec REAL_STAT "$@"
fmt=$2; shift 2
for f in "$@"; do
  ino=$(REAL_STAT -c %i "$f") || exit 1
  owner=$(awk -v i="$ino" '$1 == i { o = $2 } END { print o }' "$FAKE_STATE/owners" 2>/dev/null)
  [ -n "$owner" ] || owner=root:root
  u=${owner%%:*} g=${owner#*:}
  REAL_STAT -c "$(printf '%s' "$fmt" | sed "s/%U/$u/g; s/%G/$g/g")" "$f"
done
""",
    "systemctl": r"""
log systemctl "$@"
cmd=$1; shift
now=no props=''
while :; do
  case ${1:-} in
  --now) now=yes; shift ;;
  --no-reload) shift ;;
  -p) props="$props $2"; shift 2 ;;
  *) break ;;
  esac
done
u=${1:-}
dir=$FAKE_STATE/units; mkdir -p "$dir"
file=$FAKE_ROOT/etc/systemd/system/$u
get() { cat "$dir/$u.$1" 2>/dev/null || echo "$2"; }
set_() { echo "$2" > "$dir/$u.$1"; }
start() {
  [ -f "$file" ] || { echo "Failed to start $u: Unit $u not found." >&2; return 5; }
  line=$(sed -n 's/^ExecStart=//p' "$file" | head -n 1)
  # shellcheck disable=SC2086
  set -- $line
  exe=$1; shift
  if "$FAKE_ROOT$exe" "$@" > /dev/null 2> "$dir/$u.out"; then set_ active active
  else set_ active activating; cat "$dir/$u.out" >> "$dir/$u.journal"; fi
  echo x >> "$dir/$u.starts"
}
case $cmd in
daemon-reload) ;;
start|restart) start ;;
try-restart) [ "$(get active inactive)" = inactive ] || start ;;
enable) [ -f "$file" ] || { echo "Failed to enable unit: Unit file $u does not exist." >&2; exit 1; }
        set_ enabled enabled; [ $now = no ] || start ;;
disable) [ ! -f "$dir/$u.enabled" ] || set_ enabled disabled; [ $now = no ] || set_ active inactive ;;
stop) set_ active inactive ;;
reset-failed) [ "$(get active inactive)" = active ] || set_ active inactive ;;
is-active) s=$(get active inactive); echo "$s"; [ "$s" = active ] ;;
is-enabled) [ -f "$file" ] || exit 1; s=$(get enabled disabled); echo "$s"; [ "$s" = enabled ] ;;
show) # the main process: one per start here (no restarts by systemd itself)
  for prop in $props; do
    case $prop in
    ExecMainPID) echo "ExecMainPID=$(( $(wc -l < "$dir/$u.starts" 2>/dev/null || echo 0) + 0 ))" ;;
    NRestarts) echo "NRestarts=0" ;;
    *) echo "fake systemctl: show -p $prop is not faked" >&2; exit 1 ;;
    esac
  done ;;
*) echo "fake systemctl: $cmd is not faked" >&2; exit 1 ;;
esac
""",
    "journalctl": r"""
log journalctl "$@"
while [ $# -gt 0 ]; do case $1 in -u) u=$2; shift 2 ;; *) shift ;; esac; done
tail -n 15 "$FAKE_STATE/units/$u.journal" 2>/dev/null || true
""",
    "update-ca-certificates": r"""
log update-ca-certificates "$@"
if [ -e "$FAKE_STATE/fail-trust-update" ]; then echo "update-ca-certificates: simulated failure" >&2; exit 1; fi
echo "1 added, 0 removed; done."
""",
    "dpkg": r"""
[ "$1" = --print-architecture ] && exec cat "$FAKE_STATE/arch"
echo "fake dpkg: only --print-architecture" >&2; exit 2
""",
    "hostname": r"""
cat "$FAKE_STATE/hostname"
""",
    "curl": r"""
log curl "$@"
out='' url=''
while [ $# -gt 0 ]; do
  case $1 in
  -o) out=$2; shift 2 ;;
  --connect-timeout|--speed-limit|--speed-time|--max-time|--retry|--retry-max-time) shift 2 ;;
  -*) shift ;;
  *) url=$1; shift ;;
  esac
done
base=$(cat "$FAKE_STATE/release_url")
case $url in
"$base"/*) src=$FAKE_STATE/releases/${url#"$base"/} ;;
*) echo "curl: (6) Could not resolve host: ${url#*://}" ; exit 6 ;;
esac
[ -f "$src" ] || { echo "curl: (22) The requested URL returned error: 404"; exit 22; }
REAL_CP "$src" "$out"
""",
    "sleep": r"""
:
""",
}


class FakeNode:
    """One machine: a root directory, the state of its stand-ins, its host key."""

    def __init__(self, base: Path, hostname: str = "gpu-01", arch: str = "amd64",
                 host_key: str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeNodeHostKey",
                 without: tuple[str, ...] = ()) -> None:
        self.base = Path(base)
        self.root = self.base / "root"
        self.state = self.base / "state"
        self.bin = self.base / "bin"
        self.releases = self.state / "releases"
        self.host_key = host_key
        self.jump_host_keys: dict[str, str] = {}
        """What the jump hosts on the way to this node present, by 'host:port' (a Connection's ``jump``)."""
        self.reachable = True
        self.runs: list[Script] = []
        self.without = without
        for d in ("etc", "usr/local/bin", "usr/local/share", "etc/systemd/system", "run", "var/tmp"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for d in (self.state, self.bin, self.releases):
            d.mkdir(parents=True, exist_ok=True)
        (self.state / "hostname").write_text(hostname + "\n")
        (self.state / "arch").write_text(arch + "\n")
        (self.state / "release_url").write_text(RELEASE_URL)
        for name, body in _STANDINS.items():
            text = ("#!/bin/sh\nset -u\nlog() { printf '%s\\n' \"$*\" >> \"$FAKE_STATE/calls\"; }\n"
                    + body.replace("REAL_STAT", _REAL["stat"]).replace("REAL_CP", _REAL["cp"]))
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.path_dirs = [str(self.bin)]
        if without:
            self.path_dirs.append(str(self._tools_without(without)))
        else:
            self.path_dirs.append(os.environ.get("PATH", "/usr/bin:/bin"))

    def _tools_without(self, hidden: tuple[str, ...]) -> Path:
        """A directory of links to every command on this machine's PATH but ``hidden``."""
        tools = self.base / "tools"
        tools.mkdir(exist_ok=True)
        for d in reversed(os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)):
            if not os.path.isdir(d):
                continue
            for entry in os.scandir(d):
                if entry.name not in hidden and os.access(entry.path, os.X_OK):
                    link = tools / entry.name
                    link.unlink(missing_ok=True)
                    link.symlink_to(entry.path)
        return tools

    # ------------------------------------------------------------------ running scripts

    def run(self, script: Script, timeout: float = 900) -> sessions.Result:
        self.runs.append(script)
        env = {
            "PATH": ":".join(self.path_dirs),
            "FAKE_ROOT": str(self.root),
            "FAKE_STATE": str(self.state),
            "LANG": "C",
            "HOME": str(self.base),
        }
        command = dataclasses.replace(script, text=with_root(script.text, self.root)).command(sudo=True)
        # stdin is streamed as the SSH session streams it (a pushed release is never held whole in memory here
        # either); what the script prints goes to files, so writing can never block on a full pipe.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=out, stderr=err, env=env)
            assert proc.stdin is not None
            try:
                for chunk in stdin_chunks(script):
                    proc.stdin.write(chunk)
            except BrokenPipeError:
                pass  # the script stopped reading (it failed): its exit status says why
            finally:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
            out.seek(0)
            err.seek(0)
            return sessions.Result(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"))

    # ------------------------------------------------------------------ looking at it

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def read(self, node_path: str) -> bytes | None:
        p = self.path(node_path)
        return p.read_bytes() if p.is_file() else None

    def write(self, node_path: str, data: bytes, mode: int = 0o644) -> None:
        p = self.path(node_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)

    def mode(self, node_path: str) -> int:
        return self.path(node_path).stat().st_mode & 0o777

    @property
    def chowns(self) -> list[ChownRecord]:
        """Every chown a script made, in order: what it asked for, and the file as it was at that moment."""
        out = []
        for line in self._lines("owners"):
            ino, owner, mode, size, path = line.split(" ", 4)
            rel = "/" + str(Path(path).relative_to(self.root)) if path.startswith(str(self.root)) else path
            out.append(ChownRecord(rel, owner, int(mode, 8), int(size), int(ino)))
        return out

    def owner(self, node_path: str) -> str:
        """The owner as the node would show it: the last chown of the file's inode, else root:root."""
        ino = self.path(node_path).stat().st_ino
        return next((r.owner for r in reversed(self.chowns) if r.inode == ino), "root:root")

    def chown(self, node_path: str, owner: str, symlink: bool = False) -> None:
        """Change a file's owner (as an operator on the node would); ``symlink``: the symlink's own (``chown -h``)."""
        st = self.path(node_path).lstat() if symlink else self.path(node_path).stat()
        with open(self.state / "owners", "a") as f:
            f.write(f"{st.st_ino} {owner} {st.st_mode & 0o777:o} {st.st_size} {self.path(node_path)}\n")

    def calls(self, command: str | None = None) -> list[str]:
        """Stand-in invocations ('systemctl restart llmgw-agent.service', ...), optionally of one command."""
        lines = self._lines("calls")
        return [line for line in lines if command is None or line.split(" ", 1)[0] == command]

    def unit(self, name: str = "llmgw-agent.service") -> tuple[str, str]:
        """(active, enabled) as the fake systemd holds them."""
        def get(what: str, default: str) -> str:
            p = self.state / "units" / f"{name}.{what}"
            return p.read_text().strip() if p.exists() else default
        return get("active", "inactive"), get("enabled", "disabled")

    def set_unit(self, active: str | None = None, enabled: str | None = None, name: str = "llmgw-agent.service") -> None:
        (self.state / "units").mkdir(exist_ok=True)
        for what, value in (("active", active), ("enabled", enabled)):
            if value is not None:
                (self.state / "units" / f"{name}.{what}").write_text(value + "\n")

    @property
    def fail_trust_update(self) -> bool:
        return (self.state / "fail-trust-update").exists()

    @fail_trust_update.setter
    def fail_trust_update(self, value: bool) -> None:
        p = self.state / "fail-trust-update"
        if value:
            p.touch()
        else:
            p.unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """Temporary files, kept copies and staging dirs of the package, anywhere it writes."""
        found = []
        for d in ("etc/llmgw", "usr/local/bin", "etc/systemd/system", "usr/local/share/ca-certificates", "var/tmp", "run"):
            for p in (self.root / d).glob("*"):
                if ".llmgw-" in p.name or p.name.startswith("llmgw-stage."):
                    found.append("/" + str(p.relative_to(self.root)))
        return sorted(found)

    def files(self) -> list[str]:
        """Every file and directory under the root that the fake did not create itself."""
        skel = {"etc", "usr", "usr/local", "usr/local/bin", "usr/local/share", "etc/systemd", "etc/systemd/system",
                "run", "var", "var/tmp", "run/llmgw-pulumi.lock"}
        out = []
        for dirpath, dirs, names in os.walk(self.root):
            for n in dirs + names:
                rel = str((Path(dirpath) / n).relative_to(self.root))
                if rel not in skel:
                    out.append("/" + rel)
        return sorted(out)

    def _lines(self, name: str) -> list[str]:
        p = self.state / name
        return p.read_text().splitlines() if p.exists() else []


@dataclass(frozen=True)
class ChownRecord:
    path: str
    owner: str
    mode: int
    """The file's mode when chown was called: for a file the scripts write, after its bytes were written."""
    size: int
    inode: int


class _Session:
    def __init__(self, node: FakeNode, jump_host_keys: dict[str, str]) -> None:
        self.node = node
        self.host_key = node.host_key
        self.jump_host_keys = jump_host_keys

    def run(self, script: Script, timeout: float = 900) -> sessions.Result:
        return self.node.run(script, timeout)


class FakeNodes:
    """A ``sessions.Nodes`` over fake nodes, by address; checks host keys as the SSH pool does: a pin (the
    connection's or a jump host's ``host_key``) wins, else the key expected (recorded), else any key is taken."""

    def __init__(self, nodes: dict[str, FakeNode]) -> None:
        self.nodes = nodes
        self.sessions = 0

    @contextmanager
    def session(self, conn: Any, node: str, expected_host_key: str | None = None,
                expected_jump_keys: Any = None) -> Iterator[_Session]:
        fake = self.nodes.get(conn.host)
        if fake is None or not fake.reachable:
            raise errors.UnreachableError(node, f"cannot reach {conn.target} over ssh after {conn.wait:g}s")
        recorded_jumps = dict(expected_jump_keys or {})
        shown = {}
        for hop in conn.jump:
            where = f"{hop.host}:{hop.port}"
            want, presented = hop.host_key or recorded_jumps.get(where), fake.jump_host_keys.get(where, "")
            if want is not None and want != presented:
                raise errors.HostKeyChangedError(node, f"jump host {where} presented another host key than expected")
            shown[where] = presented
        want = conn.host_key or expected_host_key
        if want is not None and want != fake.host_key:
            raise errors.HostKeyChangedError(node, f"{conn.host} presented another host key than the one expected")
        self.sessions += 1
        yield _Session(fake, shown)

    def close_all(self) -> None:
        pass
