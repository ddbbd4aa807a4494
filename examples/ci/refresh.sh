#!/bin/sh
# What CI runs on a schedule, for one stack, from the default branch, in an environment with the state's write
# access and the nodes' SSH key (no CA key, no signer): `pulumi refresh`, which reads every node and records
# what it holds. A pull request's preview, which reaches no node, then shows the drift found here as what `up`
# repairs. A node that cannot be read keeps its recorded state and is named in this job's log.
#   examples/ci/refresh.sh STACK     (in the Pulumi project's directory, its venv active)
set -eu
exec pulumi refresh --stack "$1" --yes --non-interactive
