# shellcheck shell=sh
# AgentInstall's change (SPEC steps 5, 6 and 8) as one transaction: the llmgw
# binary, agent.yaml and the unit, and the agent running.
#
# install-agent.sh DIRS UNIT TICKS AGENT AGENT_BEFORE ARCH TAG URL \
#                  DO BINARY MODE OWNER BEFORE SIZE SHA256   (the binary)
#                  DO CONFIG MODE OWNER BEFORE SIZE -        (agent.yaml)
#                  DO UNIT_FILE MODE OWNER BEFORE SIZE -     (the unit)
# carries out AgentInstall's plan (llmgw_pulumi.nodestate.plan) and decides nothing else:
#   TICKS  tenths of a second the restarted agent must stay up
#   AGENT  restart (something is replaced), start (nothing is, but the agent
#          is not running and enabled) or keep; AGENT_BEFORE: the unit's
#          state the plan was made from (`*`: not to be re-checked)
#   ARCH   the architecture the binary's SHA256 is for (`*`: any)
#   DO     per file: keep, repair (mode and owner made right in place) or
#          write (SIZE bytes of stdin); the binary: keep, repair, fetch (the
#          node downloads URL/TAG/llmgw-TAG-linux-ARCH), push (a release the
#          operator's side downloaded and verified, on stdin) or copy (the
#          local build, on stdin). A fetched or pushed release must have
#          SHA256 and report TAG as the last word of its `--version`, run
#          from the staged file, before anything is installed; a copy must have SHA256.
#   BEFORE what the file was when the node was read (`*`: not read). Under
#          the lock, before anything changes, every BEFORE, AGENT_BEFORE and
#          ARCH is re-checked: a node that changed since exits EXIT_STALE,
#          unchanged, and the provider reads it again and plans anew.
#   Stdin: the binary's bytes (push, copy), then the config's and the unit's (write).
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
UNIT=$2 SETTLE_TICKS=$3 AGENT=$4 AGENT_BEFORE=$5 ARCH=$6 TAG=$7 URL=$8
shift 8
MODE=$1 B=$2 B_MODE=$3 B_OWNER=$4 B_BEFORE=$5 SIZE=$6 WANT=$7
shift 7
C_DO=$1 C=$2 C_MODE=$3 C_OWNER=$4 C_BEFORE=$5 C_SIZE=$6
shift 7
U_DO=$1 U=$2 U_MODE=$3 U_OWNER=$4 U_BEFORE=$5 U_SIZE=$6

# The agent must stay up for SETTLE_TICKS tenths of a second. A crash in that
# time shows at its end as a state other than active (Restart=on-failure
# makes it 'activating (auto-restart)' for RestartSec) or, once restarted, as
# another main process and restart count: two looks at the unit, not one a tick.
settle() {
  was=$(main_process)
  sleep "$((SETTLE_TICKS / 10)).$((SETTLE_TICKS % 10))"
  [ "$(unit_is is-active "$UNIT")" = active ] && [ "$(main_process)" = "$was" ]
}
main_process() { systemctl show -p ExecMainPID -p NRestarts "$UNIT" 2>/dev/null | sort; }

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
# (safe_dir). Checked first: even the leftovers of a killed run are put back
# only in a safe directory.
for f in "$B" "$C" "$U"; do safe_dir "$(dirname "$f")"; done
# An earlier run killed outright in the middle of its change left what it
# replaced: put that back first, so this run starts from the last state known to work.
for f in "$R$B" "$R$C" "$R$U"; do
  if [ -e "$f.llmgw-prev" ] || [ -e "$f.llmgw-absent" ]; then restore keep; break; fi
done
arch=$(node_arch)
recheck "the architecture" "$arch" "$ARCH"
recheck "$B" "$(now_is "$B")" "$B_BEFORE"
recheck "$C" "$(now_is "$C")" "$C_BEFORE"
recheck "$U" "$(now_is "$U")" "$U_BEFORE"
recheck "$UNIT" "$(unit_is is-active "$UNIT" | grep . || echo unknown) $(unit_is is-enabled "$UNIT" | grep . || echo unknown)" "$AGENT_BEFORE"
phase=prepare restarted=no
rollback() {
  case $phase in
  backup) for f in "$R$B" "$R$C" "$R$U"; do rm -f "$f.llmgw-prev" "$f.llmgw-absent"; done ;;
  commit) if [ "$restarted" = yes ]; then restore restart; else restore keep; fi ;;
  esac
}

# Staged in /run (a root-only tmpfs): a reboot in the middle leaves nothing behind.
stage=$(mktemp -d "$R/run/llmgw-stage.XXXXXX")
# A release server that sends nothing for 20s is given up on (and retried
# while 30s have not passed); a slow but moving download may take 10 minutes.
fetch() { curl -fsS --proto =https --connect-timeout 10 --speed-limit 1 --speed-time 20 --max-time "$3" --retry 2 --retry-max-time 30 -o "$1" "$2" 2>&1; }
case $MODE in
fetch)
  name="llmgw-$TAG-linux-$arch"
  if ! err=$(fetch "$stage/bin" "$URL/$TAG/$name" 600); then
    echo "cannot download $URL/$TAG/$name: $err; the installed agent was left as it was" >&2; exit "$EXIT_RELEASE_FETCH"
  fi
  ;;
copy|push)
  if ! dd iflag=fullblock,count_bytes bs=65536 count="$SIZE" status=none of="$stage/bin" 2>/dev/null; then
    echo "cannot stage the binary in /run (out of memory?); nothing was changed" >&2; exit "$EXIT_WRITE"
  fi
  ;;
esac
case $MODE in
fetch|copy|push)
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
  ;;
*) act "$MODE" "$B" "$B_MODE" "$B_OWNER" 0 ;;
esac
act "$C_DO" "$C" "$C_MODE" "$C_OWNER" "$C_SIZE"
act "$U_DO" "$U" "$U_MODE" "$U_OWNER" "$U_SIZE"

if [ "$AGENT" != restart ]; then
  # Nothing is replaced (a re-run, a repair of modes, or a node the script
  # onboarded): a running agent is not restarted; a stopped one is started.
  kv staged "$arch"
  if [ "$AGENT" = keep ]; then
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
systemctl enable --no-reload "$UNIT" >/dev/null 2>&1  # systemd has just read the unit: one reload, not two
restarted=yes
systemctl restart "$UNIT"
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
