# shellcheck shell=sh
# NodeIdentity's change (SPEC steps 3 and 4): the node's certificate, key and
# CA root, and the root as a system trust anchor.
#
# install-identity.sh DIRS UNIT RESTART ANCHOR [dir PATH MODE OWNER | file PATH MODE OWNER SIZE]...
#   DIRS     directories the package writes in (begin_change)
#   UNIT     the agent's unit, restarted when RESTART is `yes` (a renewed
#            identity only takes effect when the agent reconnects)
#   ANCHOR   the trust anchor: update-ca-certificates runs when it changed
#   dir      a directory to have, MODE, OWNER (user:group)
#   file     a file to have: its SIZE bytes come next on stdin
# Prints the node's hostname and architecture, `trust`, `agent`, and a survey
# line for each file.
begin_change "$1"
UNIT=$2 RESTART=$3 ANCHOR=$4
shift 4
anchor_before=$(sha256_of "$R$ANCHOR")
files=''
while [ $# -gt 0 ]; do
  case $1 in
  dir) ensure_dir "$2" "$3" "$4"; shift 4 ;;
  file) put "$2" "$3" "$4" "$5"; files="$files$2
"; shift 5 ;;
  *) echo "install-identity.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# A session that died while the files were staged ends the script here (SIGPIPE), before any changed.
kv staged identity
place
update_trust "$ANCHOR" "$anchor_before"
if [ "$RESTART" = yes ]; then
  if systemctl try-restart "$UNIT" 2>/dev/null; then kv agent restarted; else kv agent not-running; fi
fi
report_node
printf '%s' "$files" | while IFS= read -r f; do report_file "$f"; done
