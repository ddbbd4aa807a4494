# shellcheck shell=sh
# AgentInstall's delete: stop the agent (only its main process: KillMode=process
# leaves engines running), disable it, remove its files.
#
# remove-agent.sh DIRS UNIT CONFIG FIRST_LINE PATH...
#   Only while CONFIG still begins with FIRST_LINE (it names the node id): a
#   resource that replaced this one on the same machine owns the agent now.
#   PATH...  the agent's files (the unit file, CONFIG, the binary)
begin_change "$1"
UNIT=$2 CONFIG=$3 FIRST_LINE=$4
shift 4
if [ -e "$R$CONFIG" ] && [ "$(head -n 1 "$R$CONFIG")" != "$FIRST_LINE" ]; then
  kv kept 'agent.yaml belongs to another node id now'
  exit 0
fi
systemctl disable --now "$UNIT" >/dev/null 2>&1 || true
for p in "$@"; do rm -f "$R$p"; done
systemctl daemon-reload
systemctl reset-failed "$UNIT" 2>/dev/null || true
kv removed agent
