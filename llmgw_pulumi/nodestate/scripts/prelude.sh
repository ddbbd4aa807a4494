# shellcheck shell=sh
# The prelude of every program that runs on a node: helpers written once.
#
# remote.py runs `exits.sh`, this file and one script, as one text, as root:
# `sh -c PROGRAM sh ARGS...`. Everything variable reaches a script as a
# positional argument or on stdin, never inside its text.
set -u

# Every path a script touches is under $R, which is empty: the node's own /.
#
# The test hook that moves the root (tests/fakenode.py runs these scripts under a
# directory of the test machine) is not in the environment, where a setting of
# the node (sshd's AcceptEnv, pam_env, an exported variable) could reach it: the
# harness, which builds the program text itself, replaces the one line below
# with `R=<its directory>`. The text the package sends to a node always has it
# empty. Even so, a root that is not an absolute path of a directory, or that
# is `/` under another name, is refused before anything else runs.
R=''
if [ -n "$R" ]; then
  case $R:$(cd "$R" 2>/dev/null && pwd -P) in
  /*:/?*) ;;
  *) echo "llmgw-pulumi: refusing the test root $R: not an absolute path of a directory other than /" >&2; exit 2 ;;
  esac
fi

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

# changeable_by_others PREFIX PATH: when a user other than root could change
# what the absolute PATH (on the node; PREFIX: $R, or empty for a path of this
# machine as it is) resolves to, prints the first such component as
# `MODE OWNER:GROUP PATH` (`- -:- PATH` for a relative PATH, or one whose
# symlinks do not end) and succeeds; fails when only root can. PATH is
# followed as the kernel resolves it: `/`, each directory on the way, each
# symlink met (its target is then walked in turn, relative to the symlink's
# directory) and the file itself. A component is changeable by others when its
# owner is not root, or (not a symlink) it is writable by a group other than
# root's, or by everyone without being a sticky directory (as /tmp is: there a
# root-owned entry cannot be renamed or removed by others). Where the path ends
# in a name that does not exist yet, only the part that exists is checked.
# Nothing is executed: this is what the probe asks before it runs a path as root.
# With a third argument `strict`, any write bit for group or others counts
# (root's group and sticky directories too): what safe_dir asks.
changeable_by_others() {
  cb_pre=$1 cb_todo=$2 cb_dir='' cb_hops=0 cb_strict=${3:-}
  case $cb_todo in
  /*) ;;
  *) printf -- '- -:- %s\n' "$(printable "$cb_todo")"; return 0 ;;
  esac
  component_changeable "$cb_pre" / && return 0
  while [ -n "$cb_todo" ]; do
    cb_todo=${cb_todo#/}
    cb_name=${cb_todo%%/*}
    cb_todo=${cb_todo#"$cb_name"}
    case $cb_name in
    '' | .) continue ;;
    ..) cb_dir=${cb_dir%/*}; continue ;;
    esac
    cb_next=$cb_dir/$cb_name
    [ -e "$cb_pre$cb_next" ] || [ -L "$cb_pre$cb_next" ] || return 1
    component_changeable "$cb_pre" "$cb_next" && return 0
    if [ -L "$cb_pre$cb_next" ]; then
      cb_hops=$((cb_hops + 1))
      if [ "$cb_hops" -gt 40 ]; then printf -- '- -:- %s\n' "$(printable "$cb_next")"; return 0; fi
      cb_target=$(readlink "$cb_pre$cb_next")
      case $cb_target in /*) cb_dir='' ;; esac
      cb_todo=$cb_target$cb_todo
    else
      cb_dir=$cb_next
    fi
  done
  return 1
}

# component_changeable PREFIX PATH: one component, as changeable_by_others says.
component_changeable() {
  cc=$(stat -c '%a %U %G %F' "$1$2" 2>/dev/null) || return 1
  cc_mode=${cc%% *} cc=${cc#* }
  cc_user=${cc%% *} cc=${cc#* }
  cc_group=${cc%% *} cc_type=${cc#* }
  cc_perm=$((0$cc_mode))
  if [ "$cc_user" = root ]; then
    [ "$cc_type" != 'symbolic link' ] || return 1
    if [ "$cb_strict" = strict ]; then
      [ $((cc_perm & 022)) -ne 0 ] || return 1
    elif [ $((cc_perm & 020)) -eq 0 ] || [ "$cc_group" = root ]; then
      [ $((cc_perm & 2)) -ne 0 ] || return 1
      [ "$cc_type" != directory ] || [ $((cc_perm & 01000)) -eq 0 ] || return 1
    fi
  fi
  printf '%s %s:%s %s\n' "$cc_mode" "$cc_user" "$cc_group" "$(printable "$2")"
  return 0
}

# safe_dir DIR: nothing is installed into a directory a user other than root
# could write to (or whose parents they could): they could swap the file, or
# plant the copy a rollback restores (*.llmgw-prev), and have it run as root.
# DIR is followed as the kernel resolves it (changeable_by_others ... strict):
# every directory on the way and every symlink met, and where a symlink points,
# every parent of its target, must be root's and writable by root alone.
# Otherwise the script ends with EXIT_UNSAFE_DIR, naming that component and its fix.
safe_dir() {
  if sd_found=$(changeable_by_others "$R" "$1" strict); then
    sd_mode=${sd_found%% *} sd_at=${sd_found#* }
    sd_owner=${sd_at%% *} sd_at=${sd_at#* }
    echo "$sd_at is owned by $sd_owner with mode $sd_mode (on the way to $1): a user other than root could replace what is installed in it; nothing was changed" >&2
    echo "on the node: chown root:root $sd_at && chmod go-w $sd_at" >&2
    exit "$EXIT_UNSAFE_DIR"
  fi
}

# printable TEXT: TEXT with every byte that is not printable ASCII (tabs and
# newlines too, which would break the line format) made `?`.
printable() { printf '%s' "$1" | LC_ALL=C tr -c '[:print:]' '?'; }

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
  # write): the next run waits for it. Without flock there is no lock, and two
  # changes could overlap: refuse instead.
  if ! command -v flock >/dev/null 2>&1; then
    echo "this node has no flock (util-linux), which llmgw-pulumi needs to make one change at a time; nothing was changed" >&2
    exit "$EXIT_NO_LOCK"
  fi
  # The lock and the staging dirs are in /run, which only root may write:
  # a script never removes anything as root in a directory others can write.
  # (Not even a sticky /run: others could plant the lock's name there first.)
  run_is=$(stat -c '%a %U:%G' "$R/run" 2>/dev/null) || run_is='missing'
  if [ ! -d "$R/run" ] || [ $((0${run_is%% *} & 022)) -ne 0 ] || changeable_by_others "$R" /run >/dev/null; then
    echo "/run must be a directory only root can write, but it is $run_is: llmgw-pulumi keeps its lock and staging there; nothing was changed" >&2
    exit "$EXIT_NO_LOCK"
  fi
  exec 9>"$R/run/llmgw-pulumi.lock"
  if ! flock -w 600 9; then
    echo "another change to this node by llmgw-pulumi has held /run/llmgw-pulumi.lock for 600s" >&2
    exit "$EXIT_BUSY"
  fi
  # Leftovers of a run killed outright; under the lock nobody else is using them.
  # (Versions before this one staged in /var/tmp, which every user can write:
  # what they left there is not touched, and systemd-tmpfiles ages it out.)
  rm -rf "$R"/run/llmgw-stage.*
  dirs=$1
  while [ -n "$dirs" ]; do
    rm -f "$R${dirs%%:*}"/*.llmgw-new.*
    case $dirs in *:*) dirs=${dirs#*:} ;; *) dirs='' ;; esac
  done
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
# fills up fails the script before any file changed.
put() {
  new_temp "$1"
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$4" status=none of="$t" 2>/dev/null \
     || [ "$(wc -c < "$t")" -ne "$4" ]; then
    cannot_write "$1"
  fi
  stage_temp "$1" "$2" "$3"
}

# keep PATH MODE OWNER: the file stays as it is, with MODE and OWNER (user:group).
keep() {
  chown "$3" "$R$1"
  chmod "$2" "$R$1"
}

# now_is PATH: the file as the plan records it (llmgw_pulumi.nodestate.plan: `sha256,mode,user:group`), or `absent`.
now_is() {
  if [ -f "$R$1" ]; then
    printf '%s,%s\n' "$(sha256_of "$R$1")" "$(stat -c '%a,%U:%G' "$R$1")"
  else
    echo absent
  fi
}

# recheck WHAT NOW BEFORE: the plan was made from a node where WHAT was
# BEFORE (`*`: anything); under the lock it is NOW. When they differ the node
# changed since it was read: nothing is changed, and the provider reads it again.
recheck() {
  if [ "$3" != '*' ] && [ "$2" != "$3" ]; then
    echo "$1 changed since the node was read (now $2, planned from $3); nothing was changed" >&2
    exit "$EXIT_STALE"
  fi
}

# act DO PATH MODE OWNER SIZE: one file's step of the plan: `keep` (nothing),
# `repair` (mode and owner made right in place), `write` (SIZE bytes of stdin staged).
act() {
  case $1 in
  keep) ;;
  repair) keep "$2" "$3" "$4" ;;
  write) put "$2" "$3" "$4" "$5" ;;
  *) echo "llmgw-pulumi: unknown step $1 for $2" >&2; exit 2 ;;
  esac
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

# update_trust ANCHOR: run update-ca-certificates (the plan replaced the trust
# anchor ANCHOR; it costs ~1 CPU-second). Its failure is reported, not fatal.
update_trust() {
  if out=$(update-ca-certificates 2>&1); then
    kv trust updated
  else
    kv trust "failed: $(printf '%s' "$out" | tail -n 1)"
  fi
}
