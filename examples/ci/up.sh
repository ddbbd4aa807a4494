#!/bin/sh
# What CI runs once a pull request is merged, for one stack, in the protected environment that holds the
# fleet's credentials: `pulumi up --refresh` with the llmgw policy pack (its preview enforces the rules before
# anything changes). --refresh: drift is repaired and a lost node key replaced even where no scheduled refresh
# recorded it yet.
#   examples/ci/up.sh STACK [POLICY_CONFIG]     (in the Pulumi project's directory, its venv active)
# POLICY_CONFIG is the rules' config in force before this merge (the workflow checks out the commit before the
# push), so a merged pull request that loosens a rule is judged by the rule it loosened.
set -eu
stack=$1
policy=${2:-}
pack=$(python3 -c 'import llmgw_pulumi, pathlib; print(pathlib.Path(llmgw_pulumi.__file__).parent / "policy")')
set -- --stack "$stack" --yes --refresh --non-interactive --policy-pack "$pack"
if [ -n "$policy" ] && [ -f "$policy" ]; then
  set -- "$@" --policy-pack-config "$policy"
fi
exec pulumi up "$@"
