#!/bin/sh
# The Pulumi CLI the CI jobs run, for linux-x64: downloads the release archive of PULUMI_VERSION, unpacks it
# only if its sha256 is PULUMI_SHA256, and prints the directory that holds `pulumi` (put it first on PATH).
#   bin=$(examples/ci/install-pulumi.sh) && PATH="$bin:$PATH"
# Both values are pinned here, once for every job of both CI examples. To change the version, take the
# archive's sha256 from that release's pulumi-<version>-checksums.txt, check it once by your own means, and
# change both lines together. A job never runs a CLI whose archive does not match.
set -eu
PULUMI_VERSION=3.255.0
PULUMI_SHA256=cf559568e2c32f7fae56ea3de8ae5fa48973ba8c5aa9dd2b3dc0c8898fe50dba

fail() { echo "install-pulumi.sh: $*" >&2; exit 1; }
printf '%s\n' "$PULUMI_SHA256" | grep -qx '[0-9a-f]\{64\}' \
  || fail "PULUMI_SHA256 is not a sha256 (64 hex digits): set it from pulumi-$PULUMI_VERSION-checksums.txt"
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] \
  || fail "this installs the linux-x64 archive, not one for $(uname -s)-$(uname -m): pin that archive's sha256 instead"
archive=pulumi-v$PULUMI_VERSION-linux-x64.tar.gz
dir=$(mktemp -d)
curl -fsSL --proto =https --tlsv1.2 -o "$dir/$archive" "https://get.pulumi.com/releases/sdk/$archive"
# The line is as the release's checksums file has it; --strict refuses a malformed one, such as an empty sum.
printf '%s  %s\n' "$PULUMI_SHA256" "$archive" | (cd "$dir" && sha256sum -c --strict - >&2) \
  || fail "$archive is not the archive PULUMI_SHA256 names: nothing was unpacked"
tar -xzf "$dir/$archive" -C "$dir"
rm -f "$dir/$archive"
[ -x "$dir/pulumi/pulumi" ] || fail "$archive holds no pulumi/pulumi"
printf '%s\n' "$dir/pulumi"
