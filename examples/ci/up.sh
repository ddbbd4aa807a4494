#!/bin/sh
# What CI runs once a pull request is merged, for one stack: `pulumi up --refresh` with the llmgw policy pack
# (its preview enforces the rules before anything changes). --refresh, as the pull request's summary did: drift
# the summary showed as repaired is repaired, a lost node key is replaced.
#   examples/ci/up.sh STACK     (run in the Pulumi project's directory, its venv active)
set -eu
stack=$1
pack=$(python3 -c 'import llmgw_pulumi, pathlib; print(pathlib.Path(llmgw_pulumi.__file__).parent / "policy")')
set -- --stack "$stack" --yes --refresh --non-interactive --policy-pack "$pack"
if [ -f "stacks/policy.$stack.json" ]; then
  set -- "$@" --policy-pack-config "stacks/policy.$stack.json"
fi
exec pulumi up "$@"
