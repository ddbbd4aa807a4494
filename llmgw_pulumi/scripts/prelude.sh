# shellcheck shell=sh
# The prelude of every program that runs on a node: helpers written once.
#
# remote.py runs `exits.sh`, this file and one script, as one text, as root:
# `sh -c PROGRAM sh ARGS...`. Everything variable reaches a script as a
# positional argument or on stdin, never inside its text.
set -u

# Every path a script touches is under $R: empty on a node; a directory of the
# test machine under tests/fakenode.py.
R=${LLMGW_ROOT:-}

# kv KEY VALUE: one `key<TAB>value` line for the provider (facts.key_values).
kv() { printf '%s\t%s\n' "$1" "$2"; }

# sha256_of FILE: FILE's sha256 in hex, or nothing when it cannot be read.
sha256_of() { { sha256sum < "$1"; } 2>/dev/null | cut -d' ' -f1; }

# node_arch: the node's architecture as release files name it (amd64, arm64).
node_arch() { dpkg --print-architecture 2>/dev/null || uname -m; }

# unit_is is-active|is-enabled UNIT: what systemctl says, or nothing.
unit_is() { systemctl "$1" "$2" 2>/dev/null || true; }

# What the node looks like now, one line per fact (facts.parse_survey).
report_node() {
  kv hostname "$(hostname)"
  kv arch "$(node_arch)"
}
report_unit() {
  kv active "$(unit_is is-active "$1")"
  kv enabled "$(unit_is is-enabled "$1")"
}
report_text() {
  if [ -f "$R$1" ]; then printf 'text\t%s\t%s\n' "$1" "$(base64 -w0 < "$R$1")"; fi
}
report_file() {
  if [ -f "$R$1" ]; then
    printf 'file\t%s\t%s\t%s\n' "$1" "$(stat -c '%a %U %G' "$R$1")" "$(sha256_of "$R$1")"
  else
    printf 'file\t%s\t-\n' "$1"
  fi
}

# --------------------------------------------------------------------------- changing a node
#
# A script that changes the node calls `begin_change DIRS` first (DIRS: the
# directories this package writes files in, colon-separated). It then takes
# the node's lock (one change at a time), stages everything before it replaces
# anything, and however it ends, its temporary files and staging dir go and a
# change it had begun is undone (`rollback`): on an error, when its SSH
# session dies (SIGPIPE at its next write, or SIGHUP) and when the machine
# shuts down (SIGTERM). A script killed outright (SIGKILL, power loss) leaves
# them to the next run, which sweeps them under the lock.

temps='' staged='' stage=''
# shellcheck disable=SC2317 # replaced by a script that has a change to undo
rollback() { :; }
on_exit() {
  rc=$?
  set +e
  trap - EXIT HUP INT PIPE TERM
  [ "$rc" -eq 0 ] || rollback >/dev/null 2>&1
  # shellcheck disable=SC2086 # mktemp's names in our own directories: no blanks, no patterns
  [ -z "$temps" ] || rm -f $temps
  [ -z "$stage" ] || rm -rf "$stage"
  exit "$rc"
}

begin_change() {
  set -e
  umask 077
  trap on_exit EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 141' PIPE
  trap 'exit 143' TERM
  # A run whose SSH session died may still be finishing (it stops at its next
  # write): the next run waits for it.
  if [ -d "$R/run" ] && command -v flock >/dev/null 2>&1; then
    exec 9>"$R/run/llmgw-pulumi.lock"
    if ! flock -w 600 9; then
      echo "another change to this node by llmgw-pulumi has held /run/llmgw-pulumi.lock for 600s" >&2
      exit "$EXIT_BUSY"
    fi
    # Leftovers of a run killed outright; under the lock nobody else is using them.
    rm -rf "$R"/run/llmgw-stage.* "$R"/var/tmp/llmgw-stage.*  # (/var/tmp: where earlier versions staged)
    dirs=$1
    while [ -n "$dirs" ]; do
      rm -f "$R${dirs%%:*}"/*.llmgw-new.*
      case $dirs in *:*) dirs=${dirs#*:} ;; *) dirs='' ;; esac
    done
  fi
}

# cannot_write PATH: a write failed before anything was changed.
cannot_write() {
  echo "cannot write $1 (disk full or read-only?); nothing was changed" >&2
  exit "$EXIT_WRITE"
}

# ensure_dir PATH MODE OWNER: the directory exists, MODE, OWNER (user:group).
ensure_dir() {
  mkdir -p "$R$1"
  chown "$3" "$R$1"
  chmod "$2" "$R$1"
}

# new_temp PATH: a temporary file for PATH, created 0600 by root in PATH's own
# directory (no other user can ever read it, and the rename is atomic).
new_temp() {
  t=$(mktemp "$R$1.llmgw-new.XXXXXX" 2>/dev/null) || cannot_write "$1"
  temps="$temps $t"
}

# stage_temp PATH MODE OWNER: the temporary file $t, now complete, is made
# MODE and OWNER (user:group), and staged to replace PATH.
stage_temp() {
  chown "$3" "$t"
  chmod "$2" "$t"
  staged="$staged $t $R$1"
}

# put PATH MODE OWNER SIZE: the next SIZE bytes of stdin are staged for PATH.
# Nothing is in place until `place` renames every staged file, so a disk that
# fills up fails the script before any file changed. A file that already holds
# those bytes is not replaced (its inode and mtime stay): only its MODE and
# OWNER are made right, in place.
put() {
  new_temp "$1"
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$4" status=none of="$t" 2>/dev/null \
     || [ "$(wc -c < "$t")" -ne "$4" ]; then
    cannot_write "$1"
  fi
  if [ -f "$R$1" ] && [ "$(sha256_of "$t")" = "$(sha256_of "$R$1")" ]; then
    rm -f "$t"
    keep "$1" "$2" "$3"
    return 0
  fi
  stage_temp "$1" "$2" "$3"
}

# keep PATH MODE OWNER: the file stays as it is, with MODE and OWNER (user:group).
keep() {
  chown "$3" "$R$1"
  chmod "$2" "$R$1"
}

# spki_of_key FILE: the public half of the private key in FILE, as base64 of its
# DER SubjectPublicKeyInfo (one line); nothing when FILE is not a key openssl reads.
# The private key itself never leaves the node: only this is printed.
spki_of_key() {
  if der=$(openssl pkey -in "$1" -pubout -outform DER 2>/dev/null | base64 -w0) && [ -n "$der" ]; then
    printf '%s' "$der"
  fi
}

# place: every staged file replaces its destination.
place() {
  # shellcheck disable=SC2086 # as in on_exit
  set -- $staged
  while [ $# -ge 2 ]; do mv -f "$1" "$2"; shift 2; done
  staged='' temps=''
}

# update_trust ANCHOR BEFORE: run update-ca-certificates when the trust anchor
# ANCHOR no longer has the sha256 BEFORE (it costs ~1 CPU-second). Its
# failure is reported, not fatal.
update_trust() {
  if [ "$2" != "$(sha256_of "$R$1")" ]; then
    if out=$(update-ca-certificates 2>&1); then
      kv trust updated
    else
      kv trust "failed: $(printf '%s' "$out" | tail -n 1)"
    fi
  else
    kv trust unchanged
  fi
}
