#!/bin/sh
# What CI runs on a pull request, for one stack: `pulumi preview` with the llmgw policy pack, and the fleet
# change summary of the preview as Markdown (docs/operations.md, "In CI").
#   examples/ci/preview.sh STACK [OUT_DIR [POLICY_CONFIG]]   (in the Pulumi project's directory, its venv active)
# POLICY_CONFIG is the rules' config as the base branch has it (a file that does not exist: the pack's
# defaults); the pull request's own stacks/policy.*.json is never read: a pull request does not choose the
# rules it is judged by. Run the base branch's copy of this script.
# It needs read access to the state backend and nothing else: it passes no --refresh (the state is as the
# last `up` or scheduled refresh recorded it, so it reaches no node), and without PULUMI_CONFIG_PASSPHRASE (a
# pull request's job) it previews with a secrets manager that decrypts nothing (python -m llmgw_pulumi.preview.ci).
# Writes OUT_DIR/policy.txt (the policy pack's verdict, as the CLI prints it), OUT_DIR/preview.json (the
# preview's JSON, which holds no policy results) and OUT_DIR/summary.md (the comment to post: the summary,
# then the verdict). Exits non-zero when a mandatory rule is violated or a preview fails; the summary is
# written either way.
set -eu
stack=$1
out=${2:-review}
policy=${3:-}
mkdir -p "$out"
pack=$(python3 -c 'import llmgw_pulumi, pathlib; print(pathlib.Path(llmgw_pulumi.__file__).parent / "policy")')
set -- --stack "$stack" --non-interactive
config=
if [ -z "${PULUMI_CONFIG_PASSPHRASE+set}" ] && [ -z "${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
  config=$(mktemp -d)/Pulumi.$stack.yaml
  PULUMI_CONFIG_PASSPHRASE=$(python3 -c 'from llmgw_pulumi.preview.ci import REVIEW_PASSPHRASE; print(REVIEW_PASSPHRASE)')
  PULUMI_FALLBACK_TO_STATE_SECRETS_MANAGER=true
  export PULUMI_CONFIG_PASSPHRASE PULUMI_FALLBACK_TO_STATE_SECRETS_MANAGER
  set -- "$@" --config-file "$config"
fi
# The CLI writes the state's encryption salt into the config file it read; each preview gets a fresh copy
# (a config holding a secret is refused here, before the first preview).
fresh() { if [ -n "$config" ]; then python3 -m llmgw_pulumi.preview.ci review-config "$stack" "$config"; fi; }
verdict=0
fresh
if [ -n "$policy" ] && [ -f "$policy" ]; then
  pulumi preview "$@" --policy-pack "$pack" --policy-pack-config "$policy" > "$out/policy.txt" 2>&1 || verdict=$?
else
  pulumi preview "$@" --policy-pack "$pack" > "$out/policy.txt" 2>&1 || verdict=$?
fi
previewed=0
fresh
pulumi preview "$@" --json --diff --show-sames > "$out/preview.json" 2> "$out/preview.log" || previewed=$?
# The summary says in its first line when the preview failed, and lists its errors; it exits non-zero then.
summary=0
python3 -m llmgw_pulumi.preview.cli "$out/preview.json" --policy "$out/policy.txt" --ca-read-here \
  --preview-status "$previewed" --preview-log "$out/preview.log" > "$out/summary.md" || summary=$?
for status in "$previewed" "$summary" "$verdict"; do
  if [ "$status" != 0 ]; then
    cat "$out/policy.txt" "$out/preview.log" >&2
    exit "$status"
  fi
done
