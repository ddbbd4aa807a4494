#!/usr/bin/env bash
# Make the Pulumi engine available, as an operator's `pulumi` install has it:
#   - the `pulumi` CLI, at the version that matches the pinned Python SDK
#     (constraints: PULUMI_VERSION below);
#   - beside it, the Python language host `pulumi-language-python` (+ its
#     companion `pulumi-language-python-exec`), which `pulumi up` in a project
#     directory starts to run `__main__.py`;
#   - the dynamic-provider plugin `pulumi-resource-pulumi-python`;
#   - `pulumi-resource-command` $COMMAND_VERSION, pulumi-command's provider
#     plugin, in ../plugins/ beside the bin dir: it is not a bundled plugin, so
#     the CLI looks for it in its plugin cache ($PULUMI_HOME/plugins), where
#     `pulumi plugin install resource command $COMMAND_VERSION --file ...`
#     puts it (lab/stack.py does that for each PULUMI_HOME). Found on PATH
#     instead, the CLI would warn "using pulumi-resource-command from $PATH"
#     on every run.
# The CLI is built from Go modules through the Go module proxy; the language
# host and the command provider from the upstream sources in
# ../shared/third_party/ (the proxy does not serve those two modules), with
# every dependency from the proxy. Nothing is downloaded from release pages.
#
# Each part is cached outside the repository, keyed by its version:
#   $LLMGW_CACHE/engine/pulumi-$PULUMI_VERSION/bin
# with a stamp per part, so a warm run takes well under a second. Prints the
# bin directory on stdout.
#
# A regular Pulumi install already on PATH is used instead when it reports
# exactly $PULUMI_VERSION and has the language host beside it; its plugin
# cache must then hold pulumi-resource-command $COMMAND_VERSION
# (`pulumi plugin install resource command $COMMAND_VERSION`).
set -euo pipefail

PULUMI_VERSION=${PULUMI_VERSION:-v3.260.0}
COMMAND_VERSION=${COMMAND_VERSION:-v1.2.1}
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
HERE=$(cd "$(dirname "$0")/.." && pwd)
THIRD_PARTY=${LLMGW_THIRD_PARTY:-$HERE/../shared/third_party}
OUT=$CACHE/engine/pulumi-$PULUMI_VERSION
BIN=$OUT/bin
PLUGINS_DIR=$OUT/plugins
PLUGINS="pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python"

log() { printf 'engine: %s\n' "$*" >&2; }

complete_install() {  # $1: a bin dir holding pulumi; true when everything needed is beside it
  [ "$("$1/pulumi" version 2>/dev/null)" = "$PULUMI_VERSION" ] || return 1
  for p in $PLUGINS; do [ -x "$1/$p" ] || return 1; done
}

if have=$(command -v pulumi 2>/dev/null) && [ "$(dirname "$have")" != "$BIN" ] && complete_install "$(dirname "$have")"; then
  log "using $have ($PULUMI_VERSION, with its plugins)"
  dirname "$have"
  exit 0
fi
if [ -f "$OUT/.complete" ] && [ -f "$OUT/.complete-language-python" ] && [ -f "$OUT/.complete-command-$COMMAND_VERSION" ]; then
  echo "$BIN"
  exit 0
fi

need() {
  log "$1"
  log "either install Pulumi $PULUMI_VERSION (with pulumi-language-python beside it) and \`pulumi plugin install resource command $COMMAND_VERSION\`,"
  log "or provide what is missing to build them here: Go >= 1.26 and the sources in $THIRD_PARTY"
  exit 1
}
command -v go >/dev/null || need "the go toolchain is missing"

export GOMODCACHE=${GOMODCACHE:-$CACHE/go/mod}
export GOCACHE=${GOCACHE:-$CACHE/go/build}
export GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local GONOSUMDB= GOPRIVATE= GOINSECURE= GOSUMDB=sum.golang.org
mkdir -p "$BIN"

# go.mod lines every wrapper module needs: the CLI's own go.mod carries this
# replace, and a replace is not inherited by a dependent module.
CLIPBOARD_REPLACE='replace github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e'
VERSION_FLAG="-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION"

build_cli() {
  local work=$OUT/build-cli start
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  start=$(date +%s)
  printf 'module llmgw.invalid/pulumi-engine\n\ngo 1.26\n\n%s\n' "$CLIPBOARD_REPLACE" > go.mod
  log "resolving github.com/pulumi/pulumi/pkg/v3@$PULUMI_VERSION"
  go get "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@$PULUMI_VERSION" "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION" >&2
  for m in github.com/pulumi/pulumi/pkg/v3 github.com/pulumi/pulumi/sdk/v3; do
    got=$(go list -m -f '{{.Version}}' "$m")
    [ "$got" = "$PULUMI_VERSION" ] || { log "$m resolved to $got, not $PULUMI_VERSION"; exit 1; }
  done
  log "building pulumi $PULUMI_VERSION (cold: several minutes on 2 cores)"
  go build -tags osusergo,grpcnotrace -ldflags "-s -w $VERSION_FLAG" -o "$BIN/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi >&2
  # The dynamic-provider plugin and the language host's companion are scripts shipped in the sdk module.
  local sdk
  sdk=$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$BIN/"
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$BIN/"
  [ "$("$BIN/pulumi" version)" = "$PULUMI_VERSION" ] || { log "built pulumi does not report $PULUMI_VERSION"; exit 1; }
  cd / && rm -rf "$work"
  touch "$OUT/.complete"
  log "pulumi built in $(( $(date +%s) - start ))s"
}

build_language_host() {
  local src=$THIRD_PARTY/pulumi-language-python work=$OUT/build-langhost start
  [ -f "$src/main.go" ] || need "the language host's source is missing ($src/main.go)"
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  start=$(date +%s)
  # A wrapper module: the language host (the upstream source, replaced in) built
  # against the CLI's own pkg/sdk versions; its own go.mod's replaces point into
  # the pulumi monorepo and do not apply to a dependency.
  cat > go.mod <<MOD
module llmgw.invalid/pulumi-language-python

go 1.26

require (
	github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 v3.0.0
	github.com/pulumi/pulumi/pkg/v3 $PULUMI_VERSION
	github.com/pulumi/pulumi/sdk/v3 $PULUMI_VERSION
)

replace github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 => $src

$CLIPBOARD_REPLACE
MOD
  log "resolving the language host's dependencies"
  go get github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3@v3.0.0 >&2
  log "building pulumi-language-python"
  go build -tags osusergo,grpcnotrace -ldflags "-s -w $VERSION_FLAG" \
    -o "$BIN/pulumi-language-python" github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 >&2
  cd / && rm -rf "$work"
  touch "$OUT/.complete-language-python"
  log "pulumi-language-python built in $(( $(date +%s) - start ))s"
}

build_command_provider() {
  local src=$THIRD_PARTY/pulumi-command/provider work=$OUT/build-command start
  [ -f "$src/go.mod" ] || need "pulumi-command's provider source is missing ($src)"
  rm -rf "$work" && mkdir -p "$work" "$PLUGINS_DIR"
  cp -r "$src/." "$work/" && chmod -R u+w "$work" && cd "$work"
  start=$(date +%s)
  log "building pulumi-resource-command $COMMAND_VERSION"
  go build -ldflags "-s -w -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=$COMMAND_VERSION" \
    -o "$PLUGINS_DIR/pulumi-resource-command" ./cmd/pulumi-resource-command >&2
  cd / && rm -rf "$work"
  touch "$OUT/.complete-command-$COMMAND_VERSION"
  log "pulumi-resource-command built in $(( $(date +%s) - start ))s"
}

[ -f "$OUT/.complete" ] || build_cli
[ -f "$OUT/.complete-language-python" ] || build_language_host
[ -f "$OUT/.complete-command-$COMMAND_VERSION" ] || build_command_provider
echo "$BIN"
