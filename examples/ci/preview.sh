#!/bin/sh
# What CI runs on a pull request, for one stack: `pulumi preview` with the llmgw policy pack, and the fleet
# change summary of the preview as Markdown (docs/operations.md, "Reviewers").
#   examples/ci/preview.sh STACK [OUT_DIR]     (run in the Pulumi project's directory, its venv active)
# Writes OUT_DIR/policy.txt (the policy pack's verdict, as the CLI prints it), OUT_DIR/preview.json (the
# preview's JSON, which holds no policy results) and OUT_DIR/summary.md (the comment to post: the summary, then
# the verdict). Exits non-zero when a mandatory rule is violated or a preview fails; the summary is written
# either way. A policy config file stacks/policy.STACK.json, when there is one, sets the rules for that stack.
set -eu
stack=$1
out=${2:-review}
mkdir -p "$out"
pack=$(python3 -c 'import llmgw_pulumi, pathlib; print(pathlib.Path(llmgw_pulumi.__file__).parent / "policy")')
set -- --stack "$stack" --non-interactive --policy-pack "$pack"
if [ -f "stacks/policy.$stack.json" ]; then
  set -- "$@" --policy-pack-config "stacks/policy.$stack.json"
fi
status=0
pulumi preview "$@" > "$out/policy.txt" 2>&1 || status=$?
pulumi preview --stack "$stack" --non-interactive --json --diff --refresh --show-sames \
  > "$out/preview.json" 2> "$out/preview.log" || status=$?
python3 -m llmgw_pulumi.review "$out/preview.json" --policy "$out/policy.txt" > "$out/summary.md" || status=$?
if [ "$status" != 0 ]; then
  { echo; echo "**The preview failed** (exit $status): see the job's log."; } >> "$out/summary.md"
  cat "$out/policy.txt" "$out/preview.log" >&2
fi
exit "$status"
