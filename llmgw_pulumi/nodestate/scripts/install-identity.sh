# shellcheck shell=sh
# NodeIdentity's change (SPEC steps 3 and 4): the node's certificate, key and
# CA root, and the root as a system trust anchor.
#
# install-identity.sh DIRS UNIT RESTART ANCHOR TRUST [dir PATH MODE OWNER |
#                    file DO PATH MODE OWNER BEFORE SIZE | nodekey PATH MODE OWNER PENDING SPKI]...
# carries out NodeIdentity's plan (llmgw_pulumi.nodestate.plan) and decides nothing else:
#   DIRS     directories the package writes in (begin_change)
#   UNIT     the agent's unit, restarted (if it runs) when RESTART is `yes`
#            (a renewed identity only takes effect when the agent reconnects)
#   ANCHOR   the trust anchor: update-ca-certificates runs when TRUST is `yes`
#   dir      a directory to have, MODE, OWNER (user:group)
#   file     a file's step DO (keep, repair, write: its SIZE bytes come next on
#            stdin), planned from a node where it was BEFORE (`*`: not read)
#   nodekey  the key pair the node made for the certificate (keyOrigin node),
#            whose public half is SPKI: kept at PATH when it is there already,
#            else renamed from PENDING to PATH in the same step as the
#            certificate is installed. Neither: EXIT_KEY_MISSING, nothing changed.
# Every file is re-checked against BEFORE under the lock, before anything
# changes: a node that changed since it was read exits EXIT_STALE, unchanged.
# Prints the node's hostname and architecture, `trust`, `agent`, and a survey
# line for each file.
begin_change "$1"
UNIT=$2 RESTART=$3 ANCHOR=$4 TRUST=$5
shift 5
files=''
# take_node_key PATH MODE OWNER PENDING SPKI: see `nodekey` above.
take_node_key() {
  if [ -f "$R$1" ] && [ "$(spki_of_key "$R$1")" = "$5" ]; then
    keep "$1" "$2" "$3"
  elif [ -f "$R$4" ] && [ "$(spki_of_key "$R$4")" = "$5" ]; then
    chown "$3" "$R$4"
    chmod "$2" "$R$4"
    staged="$staged $R$4 $R$1"
  else
    echo "the private key for this certificate is on the node neither at $1 nor at $4; nothing was changed" >&2
    exit "$EXIT_KEY_MISSING"
  fi
}
# recheck_all ARGS...: every file step's BEFORE, and every directory (the CA
# trust anchor's too) root's alone with each real parent (safe_dir), before
# anything changes: ensure_dir changes a directory's owner and mode through symlinks.
recheck_all() {
  while [ $# -gt 0 ]; do
    case $1 in
    dir) safe_dir "$2"; shift 4 ;;
    file) recheck "$3" "$(now_is "$3")" "$6"; shift 7 ;;
    nodekey) shift 6 ;;
    *) echo "install-identity.sh: unknown argument $1" >&2; exit 2 ;;
    esac
  done
}
recheck_all "$@"
while [ $# -gt 0 ]; do
  case $1 in
  dir) ensure_dir "$2" "$3" "$4"; shift 4 ;;
  file) act "$2" "$3" "$4" "$5" "$7"; files="$files$3
"; shift 7 ;;
  nodekey) take_node_key "$2" "$3" "$4" "$5" "$6"; files="$files$2
"; shift 6 ;;
  esac
done
# A session that died while the files were staged ends the script here (SIGPIPE), before any changed.
kv staged identity
place
if [ "$TRUST" = yes ]; then update_trust "$ANCHOR"; else kv trust unchanged; fi
if [ "$RESTART" = yes ]; then
  if systemctl try-restart "$UNIT" 2>/dev/null; then kv agent restarted; else kv agent not-running; fi
fi
report_node
printf '%s' "$files" | while IFS= read -r f; do report_file "$f"; done
