#!/usr/bin/env bash
# Run `pulumi package add <this repository>` (README, "From TypeScript or Go")
# in a copy of examples/typescript-vm and of examples/go-vm, and keep what it
# leaves in the project (the generated SDK, the manifests it edited, the
# dependencies it linked), so a test sets a project up by copying it instead of
# generating the SDK again:
#   $LLMGW_CACHE/package-add/<lang>-<key>/   (stamp .complete)
# The key is a hash of every input of what the command generates: the engine's
# version, the schema this package serves (what the SDK is generated from, read
# from the component provider in-process: a change to the package that leaves
# the schema as it was reuses the SDK), PulumiPlugin.yaml and the example's
# files; any change to one of them runs the command again. The project's
# Pulumi.yaml names the repository it was made from (`packages: llmgw: <path>`):
# a copy made for another checkout is pointed at that checkout.
# Run scripts/engine.sh first (this runs scripts/language-hosts.sh). Prints the
# directory holding the <lang>-<key> directories, then the key of each
# language as "<lang> <key>".
set -euo pipefail

PULUMI_VERSION=${PULUMI_VERSION:-v3.260.0}
COMMAND_VERSION=${COMMAND_VERSION:-v1.2.1}  # the version scripts/engine.sh builds
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=$CACHE/package-add

log() { printf 'package-adds: %s\n' "$*" >&2; }

hosts=$("$HERE/scripts/language-hosts.sh")
BIN=$(sed -n 1p <<<"$hosts")
MODULES=$(sed -n 2p <<<"$hosts")

SCHEMA=$("$HERE/.venv/bin/python" -c 'from llmgw_pulumi.stack.component_host import NodeProvider; print(NodeProvider().schema)')

key_of() {  # $1: typescript or go
  (
    cd "$HERE"
    echo "$PULUMI_VERSION"
    printf '%s\n' "$SCHEMA" | sha256sum
    find "examples/$1-vm" PulumiPlugin.yaml -type f -print0 | sort -z | xargs -0 sha256sum
  ) | sha256sum | cut -c1-16
}

add() {  # $1: typescript or go, $2: its key
  local lang=$1 key=$2 dir=$OUT/$1-$2 work start
  work=$(mktemp -d "$OUT/.work-$lang-XXXXXX")
  start=$(date +%s)
  log "pulumi package add (examples/$lang-vm)"
  cp -a "$HERE/examples/$lang-vm/." "$work/project"
  if [ "$lang" = typescript ]; then  # `npm ci`, from the cache language-hosts.sh filled (hard links)
    cp -al "$MODULES" "$work/project/node_modules"
  fi
  mkdir -p "$work/home"
  (
    cd "$work/project"
    export PATH="$BIN:$PATH" PULUMI_HOME="$work/home" PULUMI_BACKEND_URL="file://$work/home" \
      PULUMI_SKIP_UPDATE_CHECK=true PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true PIP_CACHE_DIR="$CACHE/pip" \
      npm_config_cache="$CACHE/npm" npm_config_prefer_offline=true \
      GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS=-mod=mod
    # The examples use pulumi-command: its provider, as scripts/engine.sh built it (lab/stack.py does the same).
    pulumi plugin install resource command "$COMMAND_VERSION" --file "$BIN/../plugins/pulumi-resource-command" \
      --non-interactive >&2
    pulumi package add "$HERE" --non-interactive >&2
  )
  rm -rf "$dir"
  mv "$work/project" "$dir"
  rm -rf "$work"
  touch "$dir/.complete"
  log "$lang's SDK generated in $(( $(date +%s) - start ))s"
}

# `pulumi package add` also leaves the plugin's virtualenv in the checkout it
# names (.venv-plugin, PulumiPlugin.yaml), where the engine runs the component
# from. A checkout that finds the SDKs cached (made in another checkout from the
# same schema) gets the same virtualenv: the package editable at the pinned
# versions (requirements.txt), which is what scripts/install.sh put in .venv;
# copied, under the cache's lock, before any SDK is generated.
ensure_plugin_venv() {
  [ -x "$HERE/.venv-plugin/bin/python" ] && return
  log "plugin virtualenv .venv-plugin (a copy of .venv)"
  rm -rf "$HERE/.venv-plugin.tmp"
  cp -a "$HERE/.venv" "$HERE/.venv-plugin.tmp"
  mv "$HERE/.venv-plugin.tmp" "$HERE/.venv-plugin"
}

mkdir -p "$OUT"
(flock 9; ensure_plugin_venv) 9>"$OUT/.lock"
keys=""
for lang in typescript go; do
  key=$(key_of "$lang")
  if [ ! -f "$OUT/$lang-$key/.complete" ]; then
    (
      flock 9  # one at a time on this machine: the command (re)installs this package into .venv-plugin
      [ -f "$OUT/$lang-$key/.complete" ] || add "$lang" "$key"
    ) 9>"$OUT/.lock"
  fi
  keys+="$lang $key"$'\n'
done
echo "$OUT"
printf '%s' "$keys"
