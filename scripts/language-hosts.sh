#!/usr/bin/env bash
# Build the Node.js and Go language hosts beside the Python one, so a
# TypeScript or Go program can use this package's `Node` component
# (PulumiPlugin.yaml; README, "From TypeScript or Go"):
#   - pulumi-language-nodejs: what `pulumi up` starts for `runtime: nodejs`;
#   - pulumi-language-go: what `pulumi up` starts for `runtime: go`.
# Both are built from the upstream sources in ../shared/third_party/ (the Go
# module proxy does not serve them) against the CLI's own pkg/sdk versions,
# exactly like scripts/engine.sh builds pulumi-language-python, and put in the
# same bin directory as the `pulumi` binary (found on PATH instead, the CLI
# would warn on every run). Each is cached, keyed by the engine's version:
#   $LLMGW_CACHE/engine/pulumi-$PULUMI_VERSION/bin/pulumi-language-{nodejs,go}
# with a stamp .complete-language-{nodejs,go}; a warm run takes well under a
# second. Run scripts/engine.sh first; prints the bin directory on stdout.
#
# A regular Pulumi install on PATH that has both hosts beside it is used as is.
#
# Then the TypeScript example's npm packages (examples/typescript-vm: package.json
# and its lock, every version pinned) are installed from the npm registry once
# into $LLMGW_CACHE/node-modules/<sha of the lock>/node_modules (npm's own cache
# in $LLMGW_CACHE/npm); Node.js and npm come from Debian packages when missing.
# (The Go example's modules come through the Go module proxy, into
# $LLMGW_CACHE/go/mod when the tests build it.) Prints the bin directory, then
# the node_modules directory.
set -euo pipefail

PULUMI_VERSION=${PULUMI_VERSION:-v3.260.0}
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
HERE=$(cd "$(dirname "$0")/.." && pwd)
THIRD_PARTY=${LLMGW_THIRD_PARTY:-$HERE/../shared/third_party}
OUT=$CACHE/engine/pulumi-$PULUMI_VERSION
BIN=$OUT/bin
LANGUAGES="nodejs go"

log() { printf 'language-hosts: %s\n' "$*" >&2; }

if have=$(command -v pulumi 2>/dev/null) && [ "$(dirname "$have")" != "$BIN" ] \
  && [ -x "$(dirname "$have")/pulumi-language-nodejs" ] && [ -x "$(dirname "$have")/pulumi-language-go" ]; then
  BIN=$(dirname "$have")
  LANGUAGES=""
elif [ ! -f "$OUT/.complete" ]; then
  log "the engine is not built yet: run scripts/engine.sh first"; exit 1
fi

# The upstream module path of each host, below github.com/pulumi/pulumi.
module_of() {
  case $1 in
    nodejs) echo github.com/pulumi/pulumi/sdk/nodejs/cmd/pulumi-language-nodejs/v3 ;;
    go) echo github.com/pulumi/pulumi/sdk/go/pulumi-language-go/v3 ;;
  esac
}

build_host() {  # $1: nodejs or go
  local lang=$1 src=$THIRD_PARTY/pulumi-language-$1 work=$OUT/build-langhost-$1 module start
  module=$(module_of "$lang")
  [ -f "$src/main.go" ] || { log "the $lang language host's source is missing ($src/main.go)"; exit 1; }
  command -v go >/dev/null || { log "the go toolchain is missing (Go >= 1.26 builds the language hosts)"; exit 1; }
  export GOMODCACHE=${GOMODCACHE:-$CACHE/go/mod}
  export GOCACHE=${GOCACHE:-$CACHE/go/build}
  export GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local GONOSUMDB='' GOPRIVATE='' GOINSECURE='' GOSUMDB=sum.golang.org
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  start=$(date +%s)
  # A wrapper module, as for the Python host: the upstream source replaced in,
  # built against the CLI's pkg/sdk; the clipboard replace the CLI needs is
  # not inherited from a dependency's go.mod.
  cat > go.mod <<MOD
module llmgw.invalid/pulumi-language-$lang

go 1.26

require (
	$module v3.0.0
	github.com/pulumi/pulumi/pkg/v3 $PULUMI_VERSION
	github.com/pulumi/pulumi/sdk/v3 $PULUMI_VERSION
)

replace $module => $src

replace github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e
MOD
  log "resolving the $lang language host's dependencies"
  go get "$module@v3.0.0" >&2
  log "building pulumi-language-$lang"
  go build -tags osusergo,grpcnotrace \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" \
    -o "$work/pulumi-language-$lang" "$module" >&2
  case $("$work/pulumi-language-$lang" -version) in
    "$PULUMI_VERSION" | "${PULUMI_VERSION#v}") ;;
    *) log "built pulumi-language-$lang does not report $PULUMI_VERSION"; exit 1 ;;
  esac
  # Moved in whole: another run may be starting the CLI from this directory right now.
  mv "$work/pulumi-language-$lang" "$BIN/pulumi-language-$lang"
  cd / && rm -rf "$work"
  touch "$OUT/.complete-language-$lang"
  log "pulumi-language-$lang built in $(( $(date +%s) - start ))s"
}

node_modules() {  # the TypeScript example's pinned packages, once per lock file
  local lock=$HERE/examples/typescript-vm/package-lock.json key dir
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    log "apt-get install nodejs npm"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
  fi
  key=$(sha256sum "$lock" | cut -c1-16)
  dir=$CACHE/node-modules/$key
  if [ ! -f "$dir/.complete" ]; then
    log "npm ci (examples/typescript-vm, pinned)"
    rm -rf "$dir" && mkdir -p "$dir"
    cp "$HERE/examples/typescript-vm/package.json" "$lock" "$dir/"
    (cd "$dir" && npm ci --cache "$CACHE/npm" --prefer-offline --no-audit --no-fund >&2)
    touch "$dir/.complete"
  fi
  echo "$dir/node_modules"
}

for lang in $LANGUAGES; do
  [ -f "$OUT/.complete-language-$lang" ] || build_host "$lang"
done
modules=$(node_modules)
echo "$BIN"
echo "$modules"
