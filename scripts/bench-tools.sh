#!/usr/bin/env bash
# What only the benchmark (bench/onboard.py) needs, built or installed on demand
# and cached, so the test install (scripts/install.sh) stays lean:
#   - toxiproxy-server $TOXIPROXY_VERSION, built from the Go module
#     github.com/Shopify/toxiproxy/v2 through the Go module proxy into
#     $LLMGW_CACHE/toxiproxy-$TOXIPROXY_VERSION/ (with a stamp); the benchmark
#     puts it in front of every lab host's sshd to add latency without netem;
#   - matplotlib, pinned in bench/requirements.txt, into the project's .venv
#     (the benchmark draws its figures with it; the tests never import it).
# The benchmark runs this script itself at its start; `scripts/install.sh --bench`
# runs it too. A warm run takes well under a second. Prints the directory of
# toxiproxy-server on stdout. Nothing built here is committed.
set -euo pipefail
cd "$(dirname "$0")/.."

TOXIPROXY_VERSION=${TOXIPROXY_VERSION:-v2.5.0}
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
OUT=$CACHE/toxiproxy-$TOXIPROXY_VERSION
log() { printf 'bench-tools: %s\n' "$*" >&2; }

build_toxiproxy() {
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || { log "the go toolchain is missing (needed to build toxiproxy-server)"; exit 1; }
  export GOMODCACHE=${GOMODCACHE:-$CACHE/go/mod}
  export GOCACHE=${GOCACHE:-$CACHE/go/build}
  export GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local GONOSUMDB= GOPRIVATE= GOINSECURE= GOSUMDB=sum.golang.org
  local work=$OUT/build start module=github.com/Shopify/toxiproxy/v2
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  start=$(date +%s)
  # A wrapper module requiring toxiproxy at the pinned version: its own go.sum
  # and requirements decide the dependencies, as `go install pkg@version` would.
  printf 'module llmgw.invalid/toxiproxy\n\ngo 1.17\n' > go.mod
  log "resolving $module@$TOXIPROXY_VERSION"
  go get "$module/cmd/server@$TOXIPROXY_VERSION" >&2
  got=$(go list -m -f '{{.Version}}' "$module")
  [ "$got" = "$TOXIPROXY_VERSION" ] || { log "$module resolved to $got, not $TOXIPROXY_VERSION"; exit 1; }
  log "building toxiproxy-server $TOXIPROXY_VERSION"
  go build -ldflags "-s -w -X $module.Version=${TOXIPROXY_VERSION#v}" -o "$OUT/toxiproxy-server" "$module/cmd/server" >&2
  "$OUT/toxiproxy-server" --version >&2
  cd / && rm -rf "$work"
  touch "$OUT/.complete"
  log "toxiproxy-server built in $(( $(date +%s) - start ))s"
}

[ -f "$OUT/.complete" ] && [ -x "$OUT/toxiproxy-server" ] || (build_toxiproxy)  # a subshell: it changes directory

# matplotlib into the venv, pinned; keyed on the requirements file like install.sh's stamp.
stamp=.venv/.llmgw-bench-installed
want=$(sha256sum bench/requirements.txt | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  [ -x .venv/bin/pip ] || { log "no .venv: run scripts/install.sh first"; exit 1; }
  log "pip install -r bench/requirements.txt (matplotlib, for the benchmark's plots)"
  PIP_CACHE_DIR=$CACHE/pip .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -r bench/requirements.txt >&2
  echo "$want" > "$stamp"
fi
echo "$OUT"
