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
"""

from __future__ import annotations

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
)


class Exit(IntEnum):
    OK = 0
    RELEASE_FETCH = 71
    CHECKSUM = 72
    AGENT_START = 73
    WRITE = 74


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


# Shell functions shared by the scripts that write files.
_PRELUDE = r"""
set -eu
umask 077
# put PATH MODE SIZE: the next SIZE bytes of stdin become PATH, atomically,
# owned root:root. The temporary file is created 0600 by root in PATH's own
# directory, so the rename is atomic and no other user can ever read it.
put() {
  t=$(mktemp "$1.llmgw-new.XXXXXX")
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$3" status=none of="$t" \
     || [ "$(wc -c < "$t")" -ne "$3" ]; then
    rm -f "$t"; echo "cannot write $1 (disk full or read-only?)" >&2; exit 74
  fi
  chown root:root "$t" && chmod "$2" "$t" && mv -f "$t" "$1"
}
kv() { printf '%s\t%s\n' "$1" "$2"; }
"""


def _put_lines(files: Sequence[File]) -> tuple[list[str], bytes]:
    lines, payload = [], b""
    for f in files:
        lines.append(f"put {shlex.quote(f.path)} {f.mode:o} {len(f.content)}")
        payload += f.content
    return lines, payload


# --------------------------------------------------------------------------- identity

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
        f"anchor_before=$(sha256sum < {shlex.quote(TRUST_ANCHOR_PATH)} 2>/dev/null | cut -d' ' -f1 || true)",
        f"install -d -m 0755 -o root -g root {shlex.quote(IDENTITY_DIR)} /usr/local/share/ca-certificates",
        *puts,
        _TRUST,
        # A renewed identity only takes effect when the agent reconnects.
        f"systemctl try-restart {UNIT_NAME} 2>/dev/null && kv agent restarted || kv agent not-running" if restart_agent else "",
        "kv hostname \"$(hostname)\"",
        "kv arch \"$(dpkg --print-architecture 2>/dev/null || uname -m)\"",
    ])
    return Script(text, (), payload)


def remove_identity(owned: dict[str, str]) -> Script:
    """Remove identity files, but only those still holding what this resource wrote.

    ``owned`` maps path -> sha256 recorded in state; a file whose content
    differs belongs to someone else (a replacement written to the same host),
    and is left alone.
    """
    lines = [_PRELUDE, f"anchor_before=$(sha256sum < {shlex.quote(TRUST_ANCHOR_PATH)} 2>/dev/null | cut -d' ' -f1 || true)"]
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

    The previous binary, config and unit are kept aside until the restarted
    agent has stayed up for ``settle_seconds``; if it does not, they are put
    back and restarted, and the script exits 73 with the end of the journal.
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
        "arch=$(dpkg --print-architecture 2>/dev/null || uname -m)",
        "stage=$(mktemp -d /var/tmp/llmgw-stage.XXXXXX)",
        "trap 'rm -rf \"$stage\"' EXIT",
        r"""
case $MODE in
release)
  name="llmgw-$TAG-linux-$arch"
  if ! err=$(curl -fsS --connect-timeout 10 --max-time 600 --retry 2 -o "$stage/bin" "$URL/$TAG/$name" 2>&1); then
    echo "cannot download $URL/$TAG/$name: $err" >&2; exit 71
  fi
  if ! err=$(curl -fsS --connect-timeout 10 --max-time 60 --retry 2 -o "$stage/sums" "$URL/$TAG/checksums.txt" 2>&1); then
    echo "cannot download $URL/$TAG/checksums.txt: $err" >&2; exit 71
  fi
  WANT=$(awk -v n="$name" '$2 == n || $2 == "*" n { print $1; exit }' "$stage/sums")
  if [ -z "$WANT" ]; then echo "checksums.txt of $TAG has no line for $name" >&2; exit 72; fi
  ;;
copy)
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$SIZE" status=none of="$stage/bin"; then
    echo "cannot stage the binary (disk full?)" >&2; exit 74
  fi
  ;;
esac
if [ "$MODE" != keep ]; then
  got=$(sha256sum < "$stage/bin" | cut -d' ' -f1)
  if [ "$got" != "$WANT" ]; then
    echo "llmgw binary for $arch has sha256 $got, but $WANT was expected; nothing was installed" >&2; exit 72
  fi
fi
""",
        f"for f in {B} {C} {U}; do",
        '  if [ -e "$f" ]; then cp -p "$f" "$f.llmgw-prev"; else rm -f "$f.llmgw-prev"; : > "$f.llmgw-absent"; fi',
        "done",
        "restore() {",
        f"  for f in {B} {C} {U}; do",
        '    if [ -e "$f.llmgw-prev" ]; then mv -f "$f.llmgw-prev" "$f"; elif [ -e "$f.llmgw-absent" ]; then rm -f "$f"; fi',
        '    rm -f "$f.llmgw-absent"',
        "  done",
        "  systemctl daemon-reload",
        f"  if [ -e {U} ] && [ -e {B} ]; then systemctl restart {UNIT_NAME} || true; "
        f"else systemctl disable --now {UNIT_NAME} >/dev/null 2>&1 || true; fi",
        "}",
        f'if [ "$MODE" != keep ]; then install -m 0755 -o root -g root "$stage/bin" {B}.llmgw-new && mv -f {B}.llmgw-new {B}; fi',
        *puts,
        "systemctl daemon-reload",
        f"systemctl enable {UNIT_NAME} >/dev/null 2>&1",
        f"systemctl restart {UNIT_NAME}" if restart else f"systemctl start {UNIT_NAME}",
        "if ! settle; then",
        f"  journal=$(journalctl -u {UNIT_NAME} -n 15 --no-pager -o cat 2>&1 | tail -n 15)",
        "  restore",
        "  printf 'the agent did not stay running; the end of its journal:\\n%s\\n' \"$journal\" >&2",
        "  exit 73",
        "fi",
        f"for f in {B} {C} {U}; do rm -f \"$f.llmgw-prev\" \"$f.llmgw-absent\"; done",
        f"kv binary_sha256 \"$(sha256sum < {B} | cut -d' ' -f1)\"",
        "kv arch \"$arch\"",
        f"kv active \"$(systemctl is-active {UNIT_NAME} 2>/dev/null || true)\"",
    ])
    ticks = max(1, round(settle_seconds / 0.1))
    args = (mode, version, release_url.rstrip("/"), binary_sha256, str(len(binary)), str(ticks))
    return Script(text, args, binary + payload)


def remove_agent() -> Script:
    """Stop (only the agent's main process: KillMode=process leaves engines running), disable, remove."""
    B, C, U = (shlex.quote(p) for p in (BINARY_PATH, CONFIG_PATH, UNIT_PATH))
    text = "\n".join([
        _PRELUDE,
        f"systemctl disable --now {UNIT_NAME} >/dev/null 2>&1 || true",
        f"rm -f {U} {C} {B}",
        "systemctl daemon-reload",
        f"systemctl reset-failed {UNIT_NAME} 2>/dev/null || true",
        "kv removed agent",
    ])
    return Script(text)


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
