# shellcheck shell=sh
# SPEC step 7: each engine exists, is executable, and really runs (--version
# or --help exits 0 within TIMEOUT seconds). One that will not start is
# examined with ldd so the report can name the missing libraries.
#
# probe-engines.sh TIMEOUT [NAME PATH]...
# Prints `engine<TAB>NAME<TAB>runs|missing|not-executable|fails<TAB>DETAIL` per engine.
TIMEOUT=$1
shift
while [ $# -gt 0 ]; do
  name=$1 path=$R$2
  shift 2
  if [ ! -e "$path" ]; then printf 'engine\t%s\tmissing\t\n' "$name"; continue; fi
  if [ ! -f "$path" ] || [ ! -x "$path" ]; then
    printf 'engine\t%s\tnot-executable\t%s\n' "$name" "$(stat -c '%A %U' "$path")"
    continue
  fi
  if err=$(timeout "$TIMEOUT" "$path" --version 2>&1 >/dev/null </dev/null) \
     || err=$(timeout "$TIMEOUT" "$path" --help 2>&1 >/dev/null </dev/null); then
    printf 'engine\t%s\truns\t\n' "$name"
  else
    rc=$?
    libs=$(ldd "$path" 2>/dev/null | awk '/not found/ { print $1 }' | tr '\n' ' ')
    printf 'engine\t%s\tfails\trc=%s; %s; missing: %s\n' "$name" "$rc" "$(printf '%s' "$err" | tail -n 1 | tr '\t' ' ')" "$libs"
  fi
done
