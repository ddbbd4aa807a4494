# shellcheck shell=sh
# AgentInstall's change (SPEC steps 5, 6 and 8) as one transaction: the llmgw
# binary, agent.yaml and the unit, and the agent running.
#
# install-agent.sh DIRS UNIT MODE TAG URL WANT SIZE TICKS START \
#                  BINARY MODE OWNER  CONFIG MODE OWNER SIZE  UNIT_FILE MODE OWNER SIZE
#   MODE   release: the node downloads URL/TAG/llmgw-TAG-linux-<arch>, which
#                   must have the sha256 WANT lists for its arch (WANT:
#                   arch=sha256,arch=sha256: what the operator's side approved);
#          push:    a release the operator's side downloaded and verified arrives
#                   on stdin (SIZE bytes, sha256 WANT);
#          copy:    the local build arrives on stdin (SIZE bytes, sha256 WANT);
#          keep:    the binary is already right (its mode and owner are made right).
#          (release: when the installed binary has the approved sha256
#          already, nothing is downloaded and it stays.) A release (release,
#          push) must report TAG as the last word of its `--version`, run
#          from the staged file, before anything is installed.
#   TICKS  tenths of a second the restarted agent must stay up
#   START  restart|start: how the agent is (re)started
#   then each file, its mode and owner (user:group); the config's and the
#   unit's bytes follow the binary's on stdin. A config or unit SIZE of `-`
#   keeps the node's file (it says the same in other words), and a file that
#   holds the very bytes already stays too (see `put`): when nothing is to be
#   replaced, a running agent is not restarted.
#
# Everything new is staged first (download, checksum, temporary files next to
# their destinations), so a failed download, a bad checksum or a full disk end
# the script with nothing changed and the agent untouched. The previous
# binary, config and unit are then kept aside (hard links) until the
# restarted agent has stayed up; if it does not, they are put back and
# restarted, and the script exits EXIT_AGENT_START with the end of the
# journal. A script interrupted in between (its SSH session dies, the machine
# shuts down) puts them back as well; one killed outright leaves them for the
# next run, which puts them back before it starts.
#
# Prints the architecture, `staged`, the unit's state, a survey line per file
# and the text of the config and the unit.
begin_change "$1"
UNIT=$2 MODE=$3 TAG=$4 URL=$5 WANT=$6 SIZE=$7 SETTLE_TICKS=$8 START=$9
shift 9
B=$1 B_MODE=$2 B_OWNER=$3 C=$4 C_MODE=$5 C_OWNER=$6 C_SIZE=$7 U=$8 U_MODE=$9
shift 9
U_OWNER=$1 U_SIZE=$2

# The agent must stay up: a crash shows as a state other than active
# (Restart=on-failure makes it 'activating (auto-restart)').
settle() {
  i=0
  while [ "$i" -lt "$SETTLE_TICKS" ]; do
    [ "$(unit_is is-active "$UNIT")" = active ] || return 1
    sleep 0.1
    i=$((i + 1))
  done
}

# restore restart|keep: put back what the change replaced (kept as *.llmgw-prev,
# or marked *.llmgw-absent when there was nothing), then restart the agent, or
# only reload systemd when the agent was not restarted yet.
restore() {
  for f in "$R$B" "$R$C" "$R$U"; do
    if [ -e "$f.llmgw-prev" ]; then mv -f "$f.llmgw-prev" "$f"; elif [ -e "$f.llmgw-absent" ]; then rm -f "$f"; fi
    rm -f "$f.llmgw-absent"
  done
  systemctl daemon-reload
  if [ -e "$R$U" ] && [ -e "$R$B" ]; then
    if [ "$1" = restart ]; then systemctl restart "$UNIT" || true; fi
  else
    systemctl disable --now "$UNIT" >/dev/null 2>&1 || true
  fi
}
# Nothing is installed into a directory a user other than root could write to
# (or whose parents they could): they could swap the file, or plant the copy a
# rollback restores (*.llmgw-prev), and have it run as root. Checked first:
# even the leftovers of a killed run are put back only in a safe directory.
# safe_dir DIR: DIR and each parent up to / are root's and not group- or world-writable.
safe_dir() {
  d=$1
  while :; do
    if [ -e "$R$d" ]; then
      st=$(stat -c '%U %a' "$R$d/")
      owner=${st% *} perms=${st#* }
      if [ "$owner" != root ] || [ $((0$perms & 022)) -ne 0 ]; then
        echo "$d is owned by $owner with mode $perms: a user other than root could replace what is installed in it; nothing was changed" >&2
        echo "on the node: chown root:root $d && chmod go-w $d" >&2
        exit "$EXIT_UNSAFE_DIR"
      fi
    fi
    [ "$d" != / ] || break
    d=$(dirname "$d")
  done
}
for f in "$B" "$C" "$U"; do safe_dir "$(dirname "$f")"; done
# An earlier run killed outright in the middle of its change left what it
# replaced: put that back first, so this run starts from the last state known to work.
for f in "$R$B" "$R$C" "$R$U"; do
  if [ -e "$f.llmgw-prev" ] || [ -e "$f.llmgw-absent" ]; then restore keep; break; fi
done
phase=prepare restarted=no
rollback() {
  case $phase in
  backup) for f in "$R$B" "$R$C" "$R$U"; do rm -f "$f.llmgw-prev" "$f.llmgw-absent"; done ;;
  commit) if [ "$restarted" = yes ]; then restore restart; else restore keep; fi ;;
  esac
}
arch=$(node_arch)

# Staged in /run (a root-only tmpfs): a reboot in the middle leaves nothing behind.
stage=$(mktemp -d "$R/run/llmgw-stage.XXXXXX")
# A release server that sends nothing for 20s is given up on (and retried
# while 30s have not passed); a slow but moving download may take 10 minutes.
fetch() { curl -fsS --proto =https --connect-timeout 10 --speed-limit 1 --speed-time 20 --max-time "$3" --retry 2 --retry-max-time 30 -o "$1" "$2" 2>&1; }
case $MODE in
release)
  name="llmgw-$TAG-linux-$arch"
  WANT=$(printf '%s\n' "$WANT" | tr ',' '\n' | sed -n "s/^$arch=//p")
  if [ -z "$WANT" ]; then
    echo "checksums.txt of $TAG has no line for $name (or agent.sha256 no $arch digest); nothing was installed" >&2
    exit "$EXIT_CHECKSUM"
  fi
  if [ "$(sha256_of "$R$B")" = "$WANT" ]; then
    MODE=keep  # the node runs this release already: nothing to download
  elif ! err=$(fetch "$stage/bin" "$URL/$TAG/$name" 600); then
    echo "cannot download $URL/$TAG/$name: $err; the installed agent was left as it was" >&2; exit "$EXIT_RELEASE_FETCH"
  fi
  ;;
copy|push)
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$SIZE" status=none of="$stage/bin" 2>/dev/null; then
    echo "cannot stage the binary in /run (out of memory?); nothing was changed" >&2; exit "$EXIT_WRITE"
  fi
  ;;
esac
if [ "$MODE" != keep ]; then
  got=$(sha256_of "$stage/bin")
  if [ "$got" != "$WANT" ]; then
    echo "llmgw binary for $arch has sha256 $got, but $WANT was expected; nothing was installed" >&2; exit "$EXIT_CHECKSUM"
  fi
  new_temp "$B"
  cp "$stage/bin" "$t" 2>/dev/null || cannot_write "$B"
  stage_temp "$B" "$B_MODE" "$B_OWNER"
  if [ "$MODE" != copy ]; then
    # The approved bytes must also be the tag asked for (not an older build published under it).
    said=$(timeout 30 "$t" --version 2>/dev/null | awk 'NF { v = $NF } END { print v }' | tr -cd 'A-Za-z0-9.+_-' | cut -c1-64) || true
    if [ "$said" != "$TAG" ]; then
      echo "llmgw binary for $arch reports version '${said:-nothing}', not $TAG; nothing was installed" >&2
      exit "$EXIT_VERSION"
    fi
  fi
elif [ -f "$R$B" ]; then
  keep "$B" "$B_MODE" "$B_OWNER"  # the right bytes: only its mode and owner are made right, in place
fi
# SIZE `-`: the node's file says the same in other words (desired.equivalent), and stays.
if [ "$C_SIZE" = - ]; then keep "$C" "$C_MODE" "$C_OWNER"; else put "$C" "$C_MODE" "$C_OWNER" "$C_SIZE"; fi
if [ "$U_SIZE" = - ]; then keep "$U" "$U_MODE" "$U_OWNER"; else put "$U" "$U_MODE" "$U_OWNER" "$U_SIZE"; fi

if [ -z "$staged" ]; then
  # The node has this binary, config and unit already (a re-run, or a node the
  # script onboarded): nothing is replaced, and a running agent is not restarted.
  kv staged "$arch"
  if [ "$(unit_is is-active "$UNIT")" = active ] && [ "$(unit_is is-enabled "$UNIT")" = enabled ]; then
    kv agent kept
  else
    systemctl enable "$UNIT" >/dev/null 2>&1
    systemctl start "$UNIT"
    if ! settle; then
      printf 'the agent did not stay running; the end of its journal:\n%s\n' \
        "$(journalctl -u "$UNIT" -n 15 --no-pager -o cat 2>&1 | tail -n 15)" >&2
      exit "$EXIT_AGENT_START"
    fi
    kv agent started
  fi
  kv arch "$arch"
  report_unit "$UNIT"
  for f in "$B" "$C" "$U"; do report_file "$f"; done
  for f in "$C" "$U"; do report_text "$f"; done
  exit 0
fi

# What is replaced is kept as a hard link: that takes no space, so it cannot
# fail on a full disk (a copy is the fallback where links are refused). Only
# what is replaced: a file that stays is its own backup.
# back_up TEMP DEST [TEMP DEST]...: the staged pairs.
back_up() {
  while [ $# -ge 2 ]; do
    f=$2
    shift 2
    rm -f "$f.llmgw-prev" "$f.llmgw-absent"
    if [ -e "$f" ]; then
      if ! ln -f "$f" "$f.llmgw-prev" 2>/dev/null && ! cp -p "$f" "$f.llmgw-prev" 2>/dev/null; then
        echo "cannot keep a copy of ${f#"$R"} (disk full?); nothing was changed" >&2; exit "$EXIT_WRITE"
      fi
    else
      : > "$f.llmgw-absent"
    fi
  done
}
phase=backup
# shellcheck disable=SC2086 # mktemp's names and our own paths: no blanks, no patterns
back_up $staged
# A session that died during the download ends the script here (SIGPIPE), before anything changed.
kv staged "$arch"
phase=commit
place
systemctl daemon-reload
systemctl enable "$UNIT" >/dev/null 2>&1
restarted=yes
systemctl "$START" "$UNIT"
if ! settle; then
  journal=$(journalctl -u "$UNIT" -n 15 --no-pager -o cat 2>&1 | tail -n 15)
  phase=restored
  restore restart
  printf 'the agent did not stay running; the end of its journal:\n%s\n' "$journal" >&2
  exit "$EXIT_AGENT_START"
fi
phase=finished
for f in "$R$B" "$R$C" "$R$U"; do rm -f "$f.llmgw-prev" "$f.llmgw-absent"; done
kv arch "$arch"
report_unit "$UNIT"
for f in "$B" "$C" "$U"; do report_file "$f"; done
for f in "$C" "$U"; do report_text "$f"; done
