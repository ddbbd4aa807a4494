"""The shell programs that change or read a node, built as values (pure, no I/O).

Each resource operation is one ``Script``: POSIX sh text run as root with
``sh -c TEXT sh ARGS...``, plus the bytes it reads from stdin. Everything
variable reaches the script as a positional argument (never spliced into the
text), so a path like ``/opt/x; touch /tmp/pwned`` stays a path. File contents,
the private key included, travel only over the SSH channel's stdin into a
root-owned 0600 temporary file next to their destination, which is then
renamed into place: at no instant is a key readable by anyone but root, and a
reader never sees a half-written file.

Scripts print ``key<TAB>value`` lines on stdout for the provider to parse, and
human-readable reasons on stderr. Exit codes name the failure (see ``Exit``).

Scripts that change a node take a lock on it (one change at a time), stage
everything before they replace anything, and clean up and undo a begun change
however they end: an error, their SSH session dying (they stop at their next
write, before the change if it had not begun), the machine shutting down.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Sequence

from .desired import (
    BINARY_PATH,
    CA_PATH,
    CERT_PATH,
    CONFIG_PATH,
    IDENTITY_DIR,
    KEY_PATH,
    TRUST_ANCHOR_PATH,
    UNIT_NAME,
    UNIT_PATH,
    File,
    config_first_line,
)


class Exit(IntEnum):
    OK = 0
    RELEASE_FETCH = 71
    CHECKSUM = 72
    AGENT_START = 73
    WRITE = 74
    BUSY = 75
    """Another change to the node held its lock for too long."""


@dataclass(frozen=True)
class Script:
    text: str
    args: tuple[str, ...] = ()
    stdin: bytes = field(default=b"", repr=False)

    def command(self, sudo: bool) -> str:
        """The command line sshd runs: every argument shell-quoted."""
        argv = ["sh", "-c", self.text, "sh", *self.args]
        if sudo:
            argv = ["sudo", "-n", "--", *argv]
        return shlex.join(argv)


# Shell functions shared by the scripts that change a node.
_PRELUDE = r"""
set -eu
umask 077
# However the script ends, its temporary files and staging dir go, and a
# change it had begun is undone (``rollback``): on an error, when its SSH
# session dies (SIGPIPE at its next write, or SIGHUP) and when the machine
# shuts down (SIGTERM). A script killed outright (SIGKILL, power loss) leaves
# them to the next run, which sweeps them under the lock below.
temps= staged= stage=
rollback() { :; }
on_exit() {
  rc=$?
  set +e
  trap - EXIT HUP INT PIPE TERM
  [ "$rc" -eq 0 ] || rollback >/dev/null 2>&1
  [ -z "$temps" ] || rm -f $temps
  [ -z "$stage" ] || rm -rf "$stage"
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 141' PIPE
trap 'exit 143' TERM
# put PATH MODE SIZE: the next SIZE bytes of stdin are staged for PATH in a
# temporary file created 0600 by root in PATH's own directory (no other user
# can ever read it, and the rename is atomic), then made MODE, root:root.
# Nothing is in place until ``place`` renames every staged file, so a disk
# that fills up fails the script before any file changed.
put() {
  if ! t=$(mktemp "$1.llmgw-new.XXXXXX" 2>/dev/null); then
    echo "cannot write $1 (disk full or read-only?); nothing was changed" >&2; exit 74
  fi
  temps="$temps $t"
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$3" status=none of="$t" 2>/dev/null \
     || [ "$(wc -c < "$t")" -ne "$3" ]; then
    echo "cannot write $1 (disk full or read-only?); nothing was changed" >&2; exit 74
  fi
  chown root:root "$t"
  chmod "$2" "$t"
  staged="$staged $t $1"
}
place() {
  set -- $staged
  while [ $# -ge 2 ]; do t=$1; shift; mv -f "$t" "$1"; shift; done
  staged= temps=
}
kv() { printf '%s\t%s\n' "$1" "$2"; }
# One change at a time on a node: a run whose SSH session died may still be
# finishing (it stops at its next write); the next run waits for it.
if [ -d /run ] && command -v flock >/dev/null 2>&1; then
  exec 9>/run/llmgw-pulumi.lock
  if ! flock -w 600 9; then
    echo "another change to this node by llmgw-pulumi has held /run/llmgw-pulumi.lock for 600s" >&2; exit 75
  fi
  # Leftovers of a run killed outright; under the lock nobody else is using them.
  rm -rf /var/tmp/llmgw-stage.*
  for d in {sweep}; do rm -f "$d"/*.llmgw-new.*; done
fi
""".replace("{sweep}", " ".join(shlex.quote(d) for d in sorted({
    IDENTITY_DIR, posixpath.dirname(TRUST_ANCHOR_PATH), posixpath.dirname(BINARY_PATH), posixpath.dirname(UNIT_PATH)})))


def _put_lines(files: Sequence[File]) -> tuple[list[str], bytes]:
    lines, payload = [], b""
    for f in files:
        lines.append(f"put {shlex.quote(f.path)} {f.mode:o} {len(f.content)}")
        payload += f.content
    return lines, payload


# --------------------------------------------------------------------------- identity

# The trust anchor's hash before a change: _TRUST runs update-ca-certificates only if it changed.
_ANCHOR_BEFORE = f"anchor_before=$(sha256sum < {shlex.quote(TRUST_ANCHOR_PATH)} 2>/dev/null | cut -d' ' -f1 || true)"

_TRUST = r"""
if [ "$anchor_before" != "$(sha256sum < {anchor} 2>/dev/null | cut -d' ' -f1)" ]; then
  if out=$(update-ca-certificates 2>&1); then kv trust updated
  else kv trust "failed: $(printf '%s' "$out" | tail -n 1)"
  fi
else
  kv trust unchanged
fi
""".format(anchor=shlex.quote(TRUST_ANCHOR_PATH))


def install_identity(files: Sequence[File], restart_agent: bool) -> Script:
    """SPEC steps 3 and 4. update-ca-certificates runs only when the anchor changed (it costs ~1 CPU-second)."""
    puts, payload = _put_lines(files)
    text = "\n".join([
        _PRELUDE,
        _ANCHOR_BEFORE,
        f"install -d -m 0755 -o root -g root {shlex.quote(IDENTITY_DIR)} /usr/local/share/ca-certificates",
        *puts,
        # A session that died while the files were staged ends the script here (SIGPIPE), before any changed.
        "kv staged identity",
        "place",
        _TRUST,
        # A renewed identity only takes effect when the agent reconnects.
        f"systemctl try-restart {UNIT_NAME} 2>/dev/null && kv agent restarted || kv agent not-running" if restart_agent else "",
        "kv hostname \"$(hostname)\"",
        "kv arch \"$(dpkg --print-architecture 2>/dev/null || uname -m)\"",
    ])
    return Script(text, (), payload)


def remove_identity(owned: dict[str, str]) -> Script:
    """Remove the identity files, but only while the node still carries this resource's identity.

    ``owned`` maps path -> sha256 as recorded in state. When agent.pem holds a
    different certificate, another resource (the same node under a new id, a
    replacement) has installed its identity since, and everything is left to
    it: ca.pem and the trust anchor are byte-identical for both, so only the
    certificate tells whose they are.
    """
    cert_sha = owned.get(CERT_PATH, "")
    lines = [
        _PRELUDE,
        _ANCHOR_BEFORE,
        f'cert_now=$(sha256sum < {shlex.quote(CERT_PATH)} 2>/dev/null | cut -d" " -f1 || true)',
        f'if [ -n "$cert_now" ] && [ "$cert_now" != {shlex.quote(cert_sha)} ]; then',
        "  kv kept 'the node carries another identity now'",
        "  exit 0",
        "fi",
    ]
    for path, sha in sorted(owned.items()):
        q = shlex.quote(path)
        lines.append(
            f'if [ -e {q} ]; then if [ "$(sha256sum < {q} | cut -d" " -f1)" = {shlex.quote(sha)} ]; '
            f"then rm -f {q}; kv removed {q}; else kv kept {q}; fi; fi"
        )
    lines.append(_TRUST)
    lines.append(f"rmdir {shlex.quote(IDENTITY_DIR)} 2>/dev/null || true")
    return Script("\n".join(lines))


# --------------------------------------------------------------------------- agent

_SETTLE = r"""
# The agent must stay up: a crash shows as a state other than active
# (Restart=on-failure makes it 'activating (auto-restart)').
settle() {
  i=0
  while [ $i -lt "$SETTLE_TICKS" ]; do
    [ "$(systemctl is-active {unit} 2>/dev/null || true)" = active ] || return 1
    sleep 0.1; i=$((i + 1))
  done
}
""".replace("{unit}", UNIT_NAME)


def install_agent(
    *,
    mode: str,
    config: str,
    unit: str,
    version: str = "",
    release_url: str = "",
    binary: bytes = b"",
    binary_sha256: str = "",
    restart: bool = True,
    settle_seconds: float = 1.5,
) -> Script:
    """SPEC steps 5, 6 and 8 as one transaction.

    ``mode`` is ``release`` (the node downloads ``<url>/<tag>/llmgw-<tag>-linux-<arch>``
    and checks it against the release's checksums.txt before anything is
    installed), ``copy`` (the local build arrives on stdin and is checked
    against ``binary_sha256``) or ``keep`` (the binary is already right).

    Everything new is staged first (download, checksum, temporary files next
    to their destinations), so a failed download, a bad checksum or a full
    disk end the script with nothing changed and the agent untouched. The
    previous binary, config and unit are then kept aside (hard links) until
    the restarted agent has stayed up for ``settle_seconds``; if it does not,
    they are put back and restarted, and the script exits 73 with the end of
    the journal. A script interrupted in between (its SSH session dies, the
    machine shuts down) puts them back as well; one killed outright leaves
    them for the next run, which puts them back before it starts.
    """
    assert mode in ("release", "copy", "keep")
    cfg = File(CONFIG_PATH, 0o644, config.encode())
    unit_file = File(UNIT_PATH, 0o644, unit.encode())
    puts, payload = _put_lines([cfg, unit_file])
    B, C, U = (shlex.quote(p) for p in (BINARY_PATH, CONFIG_PATH, UNIT_PATH))
    text = "\n".join([
        _PRELUDE,
        _SETTLE,
        'MODE=$1 TAG=$2 URL=$3 WANT=$4 SIZE=$5 SETTLE_TICKS=$6',
        f"B={B} C={C} U={U}",
        r"""
# restore restart|keep: put back what the change replaced (kept as *.llmgw-prev,
# or marked *.llmgw-absent when there was nothing), then restart the agent, or
# only reload systemd when the agent was not restarted yet.
restore() {
  for f in "$B" "$C" "$U"; do
    if [ -e "$f.llmgw-prev" ]; then mv -f "$f.llmgw-prev" "$f"; elif [ -e "$f.llmgw-absent" ]; then rm -f "$f"; fi
    rm -f "$f.llmgw-absent"
  done
  systemctl daemon-reload
  if [ -e "$U" ] && [ -e "$B" ]; then
    if [ "$1" = restart ]; then systemctl restart {unit} || true; fi
  else
    systemctl disable --now {unit} >/dev/null 2>&1 || true
  fi
}
# An earlier run killed outright in the middle of its change left what it
# replaced: put that back first, so this run starts from the last state known to work.
for f in "$B" "$C" "$U"; do
  if [ -e "$f.llmgw-prev" ] || [ -e "$f.llmgw-absent" ]; then restore keep; break; fi
done
phase=prepare restarted=no
rollback() {
  case $phase in
  backup) for f in "$B" "$C" "$U"; do rm -f "$f.llmgw-prev" "$f.llmgw-absent"; done ;;
  commit) if [ "$restarted" = yes ]; then restore restart; else restore keep; fi ;;
  esac
}
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
stage=$(mktemp -d /var/tmp/llmgw-stage.XXXXXX)
# A release server that sends nothing for 20s is given up on (and retried
# while 30s have not passed); a slow but moving download may take 10 minutes.
fetch() { curl -fsS --connect-timeout 10 --speed-limit 1 --speed-time 20 --max-time "$3" --retry 2 --retry-max-time 30 -o "$1" "$2" 2>&1; }
case $MODE in
release)
  name="llmgw-$TAG-linux-$arch"
  if ! err=$(fetch "$stage/bin" "$URL/$TAG/$name" 600); then
    echo "cannot download $URL/$TAG/$name: $err; the installed agent was left as it was" >&2; exit 71
  fi
  if ! err=$(fetch "$stage/sums" "$URL/$TAG/checksums.txt" 60); then
    echo "cannot download $URL/$TAG/checksums.txt: $err; the installed agent was left as it was" >&2; exit 71
  fi
  WANT=$(awk -v n="$name" '$2 == n || $2 == "*" n { print $1; exit }' "$stage/sums")
  if [ -z "$WANT" ]; then echo "checksums.txt of $TAG has no line for $name; nothing was installed" >&2; exit 72; fi
  ;;
copy)
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$SIZE" status=none of="$stage/bin" 2>/dev/null; then
    echo "cannot stage the binary in /var/tmp (disk full?); nothing was changed" >&2; exit 74
  fi
  ;;
esac
if [ "$MODE" != keep ]; then
  got=$(sha256sum < "$stage/bin" | cut -d' ' -f1)
  if [ "$got" != "$WANT" ]; then
    echo "llmgw binary for $arch has sha256 $got, but $WANT was expected; nothing was installed" >&2; exit 72
  fi
  if ! t=$(mktemp "$B.llmgw-new.XXXXXX" 2>/dev/null); then
    echo "cannot write $B (disk full or read-only?); nothing was changed" >&2; exit 74
  fi
  temps="$temps $t"
  if ! cp "$stage/bin" "$t" 2>/dev/null; then
    echo "cannot write $B (disk full or read-only?); nothing was changed" >&2; exit 74
  fi
  chown root:root "$t"
  chmod 0755 "$t"
  staged="$staged $t $B"
fi
""".replace("{unit}", UNIT_NAME),
        *puts,
        r"""
# What is replaced is kept as a hard link: that takes no space, so it cannot
# fail on a full disk (a copy is the fallback where links are refused).
phase=backup
for f in "$B" "$C" "$U"; do
  rm -f "$f.llmgw-prev" "$f.llmgw-absent"
  if [ -e "$f" ]; then
    if ! ln -f "$f" "$f.llmgw-prev" 2>/dev/null && ! cp -p "$f" "$f.llmgw-prev" 2>/dev/null; then
      echo "cannot keep a copy of $f (disk full?); nothing was changed" >&2; exit 74
    fi
  else
    : > "$f.llmgw-absent"
  fi
done
# A session that died during the download ends the script here (SIGPIPE), before anything changed.
kv staged "$arch"
phase=commit
place
systemctl daemon-reload
systemctl enable {unit} >/dev/null 2>&1
restarted=yes
""".replace("{unit}", UNIT_NAME),
        f"systemctl restart {UNIT_NAME}" if restart else f"systemctl start {UNIT_NAME}",
        r"""
if ! settle; then
  journal=$(journalctl -u {unit} -n 15 --no-pager -o cat 2>&1 | tail -n 15)
  phase=restored
  restore restart
  printf 'the agent did not stay running; the end of its journal:\n%s\n' "$journal" >&2
  exit 73
fi
phase=done
for f in "$B" "$C" "$U"; do rm -f "$f.llmgw-prev" "$f.llmgw-absent"; done
kv binary_sha256 "$(sha256sum < "$B" | cut -d' ' -f1)"
kv arch "$arch"
kv active "$(systemctl is-active {unit} 2>/dev/null || true)"
""".replace("{unit}", UNIT_NAME),
    ])
    ticks = max(1, round(settle_seconds / 0.1))
    args = (mode, version, release_url.rstrip("/"), binary_sha256, str(len(binary)), str(ticks))
    return Script(text, args, binary + payload)


def remove_agent(node_id: str) -> Script:
    """Stop (only the agent's main process: KillMode=process leaves engines running), disable, remove.

    Only while agent.yaml is still this node's (its first line names the node
    id): a resource that replaced this one on the same machine owns it now.
    """
    B, C, U = (shlex.quote(p) for p in (BINARY_PATH, CONFIG_PATH, UNIT_PATH))
    text = "\n".join([
        _PRELUDE,
        f'if [ -e {C} ] && [ "$(head -n 1 {C})" != "$1" ]; then',
        "  kv kept 'agent.yaml belongs to another node id now'",
        "  exit 0",
        "fi",
        f"systemctl disable --now {UNIT_NAME} >/dev/null 2>&1 || true",
        f"rm -f {U} {C} {B}",
        "systemctl daemon-reload",
        f"systemctl reset-failed {UNIT_NAME} 2>/dev/null || true",
        "kv removed agent",
    ])
    return Script(text, (config_first_line(node_id),))


# --------------------------------------------------------------------------- reading a node

SURVEY_PATHS = (CA_PATH, CERT_PATH, KEY_PATH, TRUST_ANCHOR_PATH, BINARY_PATH, CONFIG_PATH, UNIT_PATH)


def survey(paths: Sequence[str] = SURVEY_PATHS) -> Script:
    """Read, in one round trip, what the node looks like now: see facts.parse_survey."""
    text = "\n".join([
        "set -u",
        'printf "hostname\\t%s\\n" "$(hostname)"',
        'printf "arch\\t%s\\n" "$(dpkg --print-architecture 2>/dev/null || uname -m)"',
        f'printf "active\\t%s\\n" "$(systemctl is-active {UNIT_NAME} 2>/dev/null || true)"',
        f'printf "enabled\\t%s\\n" "$(systemctl is-enabled {UNIT_NAME} 2>/dev/null || true)"',
        'for p in "$@"; do',
        '  if [ -f "$p" ]; then',
        '    printf "file\\t%s\\t%s\\t%s\\n" "$p" "$(stat -c "%a %U %G" "$p")" "$(sha256sum < "$p" | cut -d" " -f1)"',
        "  else",
        '    printf "file\\t%s\\t-\\n" "$p"',
        "  fi",
        "done",
    ])
    return Script(text, tuple(paths))


ENGINE_PROBE_TIMEOUT = 30


def probe_engines(engines: Sequence[tuple[str, str]]) -> Script:
    """SPEC step 7: each engine path exists, is executable, and really runs (--version or --help exits 0).

    A binary that will not start is examined with ldd so the report can name
    the missing libraries. Paths arrive as arguments, so any character in them
    is safe.
    """
    text = "\n".join([
        "set -u",
        "while [ $# -gt 0 ]; do",
        '  name=$1 path=$2; shift 2',
        '  if [ ! -e "$path" ]; then printf "engine\\t%s\\tmissing\\t\\n" "$name"; continue; fi',
        '  if [ ! -f "$path" ] || [ ! -x "$path" ]; then printf "engine\\t%s\\tnot-executable\\t%s\\n" "$name" "$(stat -c "%A %U" "$path")"; continue; fi',
        f'  if err=$(timeout {ENGINE_PROBE_TIMEOUT} "$path" --version 2>&1 >/dev/null </dev/null) || '
        f'err=$(timeout {ENGINE_PROBE_TIMEOUT} "$path" --help 2>&1 >/dev/null </dev/null); then',
        '    printf "engine\\t%s\\truns\\t\\n" "$name"',
        "  else",
        "    rc=$?",
        "    libs=$(ldd \"$path\" 2>/dev/null | awk '/not found/ { print $1 }' | tr '\\n' ' ')",
        '    printf "engine\\t%s\\tfails\\trc=%s; %s; missing: %s\\n" "$name" "$rc" "$(printf "%s" "$err" | tail -n 1 | tr "\\t" " ")" "$libs"',
        "  fi",
        "done",
    ])
    args: list[str] = []
    for name, path in engines:
        args += [name, path]
    return Script(text, tuple(args))
