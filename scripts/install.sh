#!/usr/bin/env bash
# Install what the project needs on this machine, idempotently; heavy things are
# cached outside the repository (LLMGW_CACHE, default /var/cache/llmgw-pulumi):
#   - Debian packages for the test hosts (systemd-nspawn, debootstrap, ...)
#   - the Python virtualenv .venv with the package and its pinned dependencies
#   - the Pulumi engine, built from Go modules (scripts/engine.sh), and the Node.js
#     and Go language hosts beside it (scripts/language-hosts.sh)
#   - the Debian rootfs the test hosts boot (lab/rootfs.sh)
#   - actionlint, which checks examples/ci (scripts/actionlint.sh)
# With --bench, also what only the benchmark needs (scripts/bench-tools.sh:
# toxiproxy-server and matplotlib); the benchmark runs that script itself too.
set -euo pipefail
cd "$(dirname "$0")/.."
export LLMGW_CACHE=${LLMGW_CACHE:-/var/cache/llmgw-pulumi}
say() { printf 'install: %s\n' "$*" >&2; }
t0=$(date +%s)

if [ "$(id -u)" != 0 ]; then
  say "run as root: the test hosts are systemd-nspawn containers in network namespaces"; exit 1
fi

# postgresql: for the state-backend tests, which start a cluster of their own on a free port (lab/postgres.py).
APT_PACKAGES="systemd-container debootstrap iproute2 gcc libc6-dev python3-venv python3-yaml openssh-client shellcheck softhsm2 libengine-pkcs11-openssl opensc postgresql"
missing=$(for p in $APT_PACKAGES; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
  say "apt-get install $missing"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >&2
fi

# The venv is rebuilt when pyproject.toml, constraints.txt or requirements.lock changes (only the venv:
# the engine and the rest are cached by their own versions); pip's cache keeps that quick.
# pyproject.toml has ranges; constraints.txt pins the exact versions the lab runs; requirements.lock
# (scripts/lock) holds them with the sha256 of every file, the build backend included, and pip
# installs nothing that is not in it with a matching hash. The package itself is then built from this
# checkout by that pinned backend, with build isolation off and nothing else fetched.
# The venv's interpreter is the distribution's /usr/bin/python3 (its python3-venv is installed above) when it
# is Python 3.11 or newer, else the first python3 on PATH. Debian's interpreter is one static binary; a pyenv
# build calls into a shared libpython and, by default, is built without --enable-optimizations. Every engine run
# starts about ten pythons, so a faster interpreter shortens every run.
python=python3
if /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then python=/usr/bin/python3; fi
stamp=.venv/.llmgw-installed
want=$( (cat pyproject.toml constraints.txt requirements.lock; "$python" -VV) | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "python virtualenv .venv ($("$python" -V), $(command -v "$python"))"
  "$python" -m venv --clear .venv
  export PIP_CACHE_DIR=$LLMGW_CACHE/pip PIP_DISABLE_PIP_VERSION_CHECK=1
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements.lock >&2
  .venv/bin/pip install -q --no-deps --no-build-isolation --no-index -e . >&2
  echo "$want" > "$stamp"
fi

# The checkout's own modules, compiled to bytecode: every engine run starts several pythons that import the
# package (the program, a provider process per shard), and under PYTHONDONTWRITEBYTECODE none of them keeps
# what it compiled, so each would compile the package again. Only what changed is compiled again here.
.venv/bin/python -m compileall -q llmgw_pulumi lab tests bench >/dev/null
scripts/engine.sh >/dev/null
scripts/actionlint.sh >/dev/null
scripts/language-hosts.sh >/dev/null
lab/rootfs.sh >/dev/null
if [ "${1:-}" = --bench ]; then scripts/bench-tools.sh >/dev/null; fi
say "ready in $(( $(date +%s) - t0 ))s"
