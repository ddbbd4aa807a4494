# shellcheck shell=sh
# What the node looks like now, in one round trip (facts.parse_survey).
#
# survey.sh UNIT PATH... [--text PATH...]: after --text, files whose text is reported too.
report_node
report_unit "$1"
shift
text=
for p in "$@"; do
  if [ "$p" = --text ]; then text=1; continue; fi
  report_file "$p"
  if [ -n "$text" ]; then report_text "$p"; fi
done
