# shellcheck shell=sh
# What the node looks like now, in one round trip (facts.parse_survey).
#
# survey.sh UNIT PATH...
report_node
report_unit "$1"
shift
for p in "$@"; do report_file "$p"; done
