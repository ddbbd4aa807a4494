# shellcheck shell=sh
# AgentInstall's delete: stop the agent (only its main process: KillMode=process
# leaves engines running), disable it, remove its files.
#
# remove-agent.sh DIRS UNIT CONFIG OWNER PATH...
#   Only while CONFIG's first line still begins with OWNER ("# <node id>, written
#   by "): a resource that replaced this one on the same machine owns the agent now.
#   PATH...  the agent's files (the unit file, CONFIG, the binary)
begin_change "$1"
UNIT=$2 CONFIG=$3 OWNER=$4
shift 4
first_line=$(head -n 1 "$R$CONFIG" 2>/dev/null || true)
if [ -e "$R$CONFIG" ] && [ "${first_line#"$OWNER"}" = "$first_line" ]; then
  kv kept 'agent.yaml belongs to another node id now'
  exit 0
fi
systemctl disable --now "$UNIT" >/dev/null 2>&1 || true
for p in "$@"; do rm -f "$R$p"; done
systemctl daemon-reload
systemctl reset-failed "$UNIT" 2>/dev/null || true
kv removed agent
