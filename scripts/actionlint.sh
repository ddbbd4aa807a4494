#!/usr/bin/env bash
# Build actionlint (the GitHub Actions workflow checker the static tests run over examples/ci) from its Go module,
# through the Go module proxy, once per version: $LLMGW_CACHE/actionlint-$ACTIONLINT_VERSION/actionlint.
# Prints the binary's path on stdout.
set -euo pipefail
ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
OUT=$CACHE/actionlint-$ACTIONLINT_VERSION
if [ ! -x "$OUT/actionlint" ]; then
  command -v go >/dev/null || { echo "actionlint: the go toolchain is missing (needed once to build actionlint)" >&2; exit 1; }
  echo "actionlint: building github.com/rhysd/actionlint $ACTIONLINT_VERSION" >&2
  mkdir -p "$OUT"
  GOMODCACHE=${GOMODCACHE:-$CACHE/go/mod} GOCACHE=${GOCACHE:-$CACHE/go/build} GOFLAGS=-trimpath CGO_ENABLED=0 \
    GONOSUMDB= GOPRIVATE= GOINSECURE= GOSUMDB=sum.golang.org \
    GOTOOLCHAIN=local GOBIN="$OUT/.build" go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" >&2
  mv "$OUT/.build/actionlint" "$OUT/actionlint" && rmdir "$OUT/.build"
fi
echo "$OUT/actionlint"
