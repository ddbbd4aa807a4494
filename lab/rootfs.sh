#!/usr/bin/env bash
# Build (once) the Debian rootfs the test hosts boot, and print its path.
# Cached outside the repository, keyed by suite and package list, so a warm run
# is instant. The hosts boot real systemd from it under systemd-nspawn.
set -euo pipefail

SUITE=bookworm
MIRROR=${LLMGW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,dbus,libpam-systemd,openssh-server,sudo,ca-certificates,curl,iproute2,procps,python3-minimal,python3-yaml
CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
KEY=$(printf '%s\n' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
ROOTFS=$CACHE/rootfs/$SUITE-$KEY

if [ -f "$ROOTFS/.complete" ]; then echo "$ROOTFS"; exit 0; fi
command -v debootstrap >/dev/null || { echo "rootfs: debootstrap is missing; run scripts/setup" >&2; exit 1; }
rm -rf "$ROOTFS.tmp"
mkdir -p "$(dirname "$ROOTFS")"
start=$(date +%s)
echo "rootfs: debootstrap $SUITE into $ROOTFS (once; about a minute)" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS.tmp" "$MIRROR" >"$ROOTFS.log" 2>&1 ||
  { echo "rootfs: debootstrap failed; see $ROOTFS.log" >&2; tail -5 "$ROOTFS.log" >&2; exit 1; }
# Nothing from the build machine's identity may leak into the hosts.
rm -f "$ROOTFS.tmp"/etc/ssh/ssh_host_*
: > "$ROOTFS.tmp/etc/machine-id"
rm -f "$ROOTFS.tmp/etc/hostname"
rm -rf "$ROOTFS.tmp"/var/cache/apt/archives/*.deb
rm -rf "$ROOTFS"
mv "$ROOTFS.tmp" "$ROOTFS"
touch "$ROOTFS/.complete"
echo "rootfs: built in $(( $(date +%s) - start ))s, $(du -sh "$ROOTFS" | cut -f1)" >&2
echo "$ROOTFS"
