# shellcheck shell=sh
# SPEC step 7: each engine exists, is executable, and really runs (--version
# or --help exits 0 within TIMEOUT seconds). One that will not start is
# examined with ldd so the report can name the missing libraries. In the same
# run, the node's inventory: its GPUs as nvidia-smi reports them, and its
# InfiniBand HCAs (the directories under IB_ROOT).
#
# probe-engines.sh TIMEOUT NVIDIA_SMI IB_ROOT FIELDS [NAME PATH]...
# NVIDIA_SMI: its path, or empty for nvidia-smi on PATH; FIELDS: what --query-gpu asks for.
# Prints `engine<TAB>NAME<TAB>runs|missing|not-executable|fails|unsafe<TAB>DETAIL` per engine,
# `smi<TAB>ok|none|missing|fails|unsafe<TAB>PATH<TAB>DETAIL`, then when ok `gpu<TAB>CSV ROW` per GPU and
# `smi-header<TAB>LINE` (driver and CUDA version), and `hca<TAB>NAME` per HCA (facts.parse_inventory).
# For the readiness verdict (llmgw_pulumi.readiness.from_probe), in the same run: `smi-xml<TAB>LINE` per line
# of `nvidia-smi -q -x`, `xid<TAB>LINE` per Xid line of the kernel log since boot (when there is an
# nvidia-smi), and `ib-port<TAB>HCA<TAB>PORT<TAB>STATE<TAB>PHYS_STATE<TAB>RATE` per port of each HCA.
#
# This runs as root. An engine, or nvidia-smi, that a user other than root could
# change (the file, a directory on the way to it, a symlink met: see
# changeable_by_others) is never run, not even `ldd` (which may execute it): it
# is `unsafe`, with DETAIL `MODE OWNER:GROUP COMPONENT`, the first such component.
TIMEOUT=$1 smi=$2 ib_root=$3 fields=$4
shift 4
MAX_XML=8388608 MAX_XID=256 smi_found=none

# last_line TEXT: its last non-empty line, tabs made spaces.
last_line() { printf '%s\n' "$1" | awk 'NF { l = $0 } END { print l }' | tr '\t' ' '; }

inventory() {
  if [ -n "$smi" ]; then
    run=$R$smi on=$R
  else
    run=$(command -v nvidia-smi 2>/dev/null) || run=''
    if [ -z "$run" ]; then printf 'smi\tnone\t\t\n'; return 0; fi
    smi=$run on=''  # found on root's PATH: a path of this machine as it is
  fi
  if found=$(changeable_by_others "$on" "$smi"); then
    printf 'smi\tunsafe\t%s\t%s\n' "$(printable "$smi")" "$found"; return 0
  fi
  if [ ! -e "$run" ]; then printf 'smi\tmissing\t%s\t\n' "$smi"; return 0; fi
  rc=0
  out=$(timeout "$TIMEOUT" "$run" --query-gpu="$fields" --format=csv,noheader,nounits 2>&1 </dev/null) || rc=$?
  [ "$rc" -ne 0 ] || plain=$(timeout "$TIMEOUT" "$run" 2>&1 </dev/null) || { rc=$?; out=$plain; }
  if [ "$rc" -ne 0 ]; then
    printf 'smi\tfails\t%s\trc=%s; %s\n' "$smi" "$rc" "$(last_line "$out")"; smi_found=fails
    return 0
  fi
  printf 'smi\tok\t%s\t\n' "$smi"; smi_found=ok
  printf '%s\n' "$out" | awk 'NF { print "gpu\t" $0 }'
  printf '%s\n' "$plain" | awk '/CUDA Version/ { print "smi-header\t" $0; exit }'
  # The GPUs' health, for the readiness verdict: the whole report, at most MAX_XML bytes.
  { timeout "$TIMEOUT" "$run" -q -x 2>/dev/null </dev/null || :; } | head -c "$MAX_XML" | awk '{ print "smi-xml\t" $0 }'
}

# xid_lines: the driver's Xid lines in the kernel log since boot (the last MAX_XID of them, each cut to 512
# characters): from journald, which keeps the whole boot, or where it cannot be read from dmesg (the kernel's
# ring buffer, which forgets). Each is run from the system's root-owned directories, never from PATH.
xid_lines() {
  for log in /usr/bin/journalctl /bin/journalctl /usr/bin/dmesg /bin/dmesg; do
    [ -x "$R$log" ] || continue
    if changeable_by_others "$R" "$log" >/dev/null; then continue; fi
    case $log in
    */journalctl)
      timeout "$TIMEOUT" "$R$log" -k -b -q -n 0 --no-pager </dev/null >/dev/null 2>&1 || continue
      how='-k -b -q -o short-monotonic --no-pager' ;;
    *) how='' ;;
    esac
    # shellcheck disable=SC2086  # $how: the options above, split into words
    timeout "$TIMEOUT" "$R$log" $how </dev/null 2>/dev/null | grep -F 'NVRM: Xid' | tail -n "$MAX_XID" \
      | cut -c 1-512 | awk '{ print "xid\t" $0 }'
    return 0
  done
}

inventory
case $smi_found in ok | fails) xid_lines ;; esac
if [ -d "$R$ib_root" ]; then
  for d in "$R$ib_root"/*; do
    [ -e "$d" ] || continue
    printf 'hca\t%s\n' "${d##*/}"
    # Each port's state, physical state and rate: the first line of each file, empty when it cannot be read.
    for p in "$d"/ports/*; do
      [ -d "$p" ] || continue
      printf 'ib-port\t%s\t%s' "${d##*/}" "${p##*/}"
      for f in state phys_state rate; do printf '\t%s' "$(head -n 1 "$p/$f" 2>/dev/null | tr '\t' ' ' | cut -c 1-128)"; done
      printf '\n'
    done
  done
fi

while [ $# -gt 0 ]; do
  name=$1 wanted=$2 path=$R$2
  shift 2
  if found=$(changeable_by_others "$R" "$wanted"); then printf 'engine\t%s\tunsafe\t%s\n' "$name" "$found"; continue; fi
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
    printf 'engine\t%s\tfails\trc=%s; %s; missing: %s\n' "$name" "$rc" "$(last_line "$err")" "$libs"
  fi
done
