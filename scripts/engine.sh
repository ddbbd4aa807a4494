#!/usr/bin/env bash
# Make the Pulumi engine available: the `pulumi` CLI and the dynamic-provider
# plugin `pulumi-resource-pulumi-python`, at the version that matches the pinned
# Python SDK (pyproject.toml). Built from Go modules through the Go module proxy
# with the ordinary `go` client; nothing is downloaded from release pages.
#
# The build is cached outside the repository, keyed by version:
#   $LLMGW_CACHE/engine/pulumi-$PULUMI_VERSION/bin
# so a warm run takes well under a second. Prints the bin directory on stdout.
#
# A `pulumi` already on PATH is used instead when it reports exactly
# $PULUMI_VERSION and has pulumi-resource-pulumi-python beside it or on PATH.
set -euo pipefail

PULUMI_VERSION=${PULUMI_VERSION:-v3.260.0}
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
OUT=$CACHE/engine/pulumi-$PULUMI_VERSION
BIN=$OUT/bin

log() { printf 'engine: %s\n' "$*" >&2; }

if have=$(command -v pulumi 2>/dev/null) && [ "$have" != "$BIN/pulumi" ]; then
  if [ "$("$have" version 2>/dev/null)" = "$PULUMI_VERSION" ] &&
     { [ -x "$(dirname "$have")/pulumi-resource-pulumi-python" ] || command -v pulumi-resource-pulumi-python >/dev/null; }; then
    log "using $have ($PULUMI_VERSION)"
    dirname "$have"
    exit 0
  fi
fi

if [ -x "$BIN/pulumi" ] && [ -f "$OUT/.complete" ]; then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "the go toolchain is needed to build the engine; install Go >= 1.26"; exit 1; }

export GOMODCACHE=${GOMODCACHE:-$CACHE/go/mod}
export GOCACHE=${GOCACHE:-$CACHE/go/build}
export GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local GONOSUMDB= GOPRIVATE=
WORK=$OUT/build
rm -rf "$WORK" "$BIN"
mkdir -p "$WORK" "$BIN"
cd "$WORK"
start=$(date +%s)

cat > go.mod <<MOD
module llmgw.invalid/pulumi-engine

go 1.26

// The CLI's own go.mod carries this replace; it is not inherited by a
// dependent module, so it is repeated here.
replace github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e
MOD

log "resolving github.com/pulumi/pulumi/pkg/v3@$PULUMI_VERSION"
go get "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@$PULUMI_VERSION" "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION" >&2
for m in github.com/pulumi/pulumi/pkg/v3 github.com/pulumi/pulumi/sdk/v3; do
  got=$(go list -m -f '{{.Version}}' "$m")
  [ "$got" = "$PULUMI_VERSION" ] || { log "$m resolved to $got, not $PULUMI_VERSION"; exit 1; }
done

log "building pulumi $PULUMI_VERSION (cold: several minutes on 2 cores)"
go build -tags osusergo,grpcnotrace \
  -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" \
  -o "$BIN/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi >&2

# The dynamic-provider plugin is a shell script shipped in the sdk module.
SDK=$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)
install -m 0755 "$SDK/python/dist/pulumi-resource-pulumi-python" "$BIN/"
install -m 0755 "$SDK/python/cmd/pulumi-language-python-exec" "$BIN/"

[ "$("$BIN/pulumi" version)" = "$PULUMI_VERSION" ] || { log "built pulumi does not report $PULUMI_VERSION"; exit 1; }
rm -rf "$WORK"
touch "$OUT/.complete"
log "built in $(( $(date +%s) - start ))s"
echo "$BIN"
