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
# For the readiness verdict (llmgw_pulumi.health.readiness.from_probe), in the same run: `smi-xml<TAB>LINE` per line
# of `nvidia-smi -q -x`, `xid<TAB>LINE` per Xid line of the kernel log since boot (when there is an
# nvidia-smi), and `ib-port<TAB>HCA<TAB>PORT<TAB>STATE<TAB>PHYS_STATE<TAB>RATE` per port of each HCA.
#
# This runs as root. An engine, or nvidia-smi, that a user other than root could
# change is never run, not even `ldd` (which may execute it): it is `unsafe`,
# with DETAIL `MODE OWNER:GROUP COMPONENT`, the first such component. What counts
# is everything that runs before the program's own code
# (startup_changeable_by_others): the file, a directory on the way to it, a
# symlink met (changeable_by_others), the interpreter its `#!` line names (and
# the program `env` is told to find), and for an ELF file its ELF interpreter and
# the directories of its RUNPATH. (What a program does once it runs, such as a
# script that execs a user's environment, only its owner can vouch for: the
# agent runs the engines as root too.)
TIMEOUT=$1 smi=$2 ib_root=$3 fields=$4
shift 4
MAX_XML=8388608 MAX_XID=256 smi_found=none

# elf_words FILE OFFSET SIZE WIDTH: the SIZE bytes at OFFSET in FILE as
# unsigned 32-bit words in the file's byte order ($el_order), WIDTH bytes a line.
elf_words() { od -An -v -tu4 -w"$4" -j "$2" -N "$3" --endian="$el_order" "$1" 2>/dev/null; }

# elf_string FILE OFFSET: the NUL-ended string at OFFSET in FILE (at most 4096 bytes of it).
elf_string() { tail -c +"$(($2 + 1))" "$1" 2>/dev/null | head -c 4096 | tr '\0' '\n' | head -n 1; }

# elf_loads FILE ORIGIN: what the kernel and the dynamic loader read from
# elsewhere to start the ELF file FILE (ORIGIN: its directory on the node), one
# path a line: its ELF interpreter (PT_INTERP) and each directory of its
# DT_RUNPATH and DT_RPATH, with $ORIGIN made ORIGIN. Nothing for a file that is
# not ELF. (Read with od and awk: a node need not have readelf.)
elf_loads() {
  el_f=$1 el_origin=$2
  [ "$(head -c 4 "$el_f" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || return 0
  case $(od -An -tu1 -j4 -N2 "$el_f" | tr -s ' ') in
  ' 2 1') el_w=8 el_order=little ;;
  ' 1 1') el_w=4 el_order=little ;;
  ' 2 2') el_w=8 el_order=big ;;
  ' 1 2') el_w=4 el_order=big ;;
  *) return 0 ;;
  esac
  # A 64-bit value is two words, the low one first in a little-endian file.
  # shellcheck disable=SC2016 # awk's fields
  el_awk='function v(i) { return w == 4 ? $i : big ? $i * 4294967296 + $(i + 1) : $i + $(i + 1) * 4294967296 }'
  el_big=0
  [ "$el_order" = little ] || el_big=1
  # e_phoff, e_phentsize, e_phnum.
  # shellcheck disable=SC2046 # numbers, split on purpose
  if [ "$el_w" = 8 ]; then
    set -- $(elf_words "$el_f" 32 8 8 | awk -v w=8 -v big="$el_big" "$el_awk { print v(1) }") \
      $(od -An -tu2 -j 54 -N 4 --endian="$el_order" "$el_f")
  else
    set -- $(elf_words "$el_f" 28 4 4) $(od -An -tu2 -j 42 -N 4 --endian="$el_order" "$el_f")
  fi
  [ $# -eq 3 ] && [ "$2" -gt 0 ] || return 0
  # Program headers: PT_LOAD (1) maps addresses to file offsets; PT_DYNAMIC (2); PT_INTERP (3).
  el_heads=$(elf_words "$el_f" "$1" $(($2 * $3)) "$2" | awk -v w="$el_w" -v big="$el_big" "$el_awk"'
    { if (w == 8) { off = v(3); va = v(5); sz = v(9) } else { off = $2; va = $3; sz = $5 }
      if ($1 == 1 || $1 == 2 || $1 == 3) printf "%d %.0f %.0f %.0f\n", $1, off, va, sz }')
  el_interp=$(printf '%s\n' "$el_heads" | awk '$1 == 3 { print $2; exit }')
  [ -z "$el_interp" ] || elf_string "$el_f" "$el_interp"
  # shellcheck disable=SC2046 # numbers, split on purpose
  set -- $(printf '%s\n' "$el_heads" | awk '$1 == 2 { print $2, $4; exit }')
  [ $# -eq 2 ] || return 0
  # The dynamic section: DT_STRTAB (5), an address; DT_RPATH (15) and DT_RUNPATH (29), offsets in it.
  el_dyn=$(elf_words "$el_f" "$1" "$2" $((2 * el_w)) | awk -v w="$el_w" -v big="$el_big" "$el_awk"'
    { tag = v(1); val = w == 8 ? v(3) : $2 }
    tag == 0 { exit }
    tag == 5 || tag == 15 || tag == 29 { printf "%d %.0f\n", tag, val }')
  el_strtab=$(printf '%s\n' "$el_dyn" | awk '$1 == 5 { print $2; exit }')
  el_stroff=$(printf '%s\n' "$el_heads" | awk -v a="${el_strtab:-x}" \
    '$1 == 1 && a != "x" && a >= $3 && a < $3 + $4 { printf "%.0f\n", a - $3 + $2; exit }')
  [ -n "$el_stroff" ] || return 0
  for el_at in $(printf '%s\n' "$el_dyn" | awk '$1 != 5 { print $2 }'); do
    elf_string "$el_f" $((el_stroff + el_at)) | tr ':' '\n' | while IFS= read -r el_dir; do
      while :; do
        # shellcheck disable=SC2016 # the loader's token, literally
        case $el_dir in
        *'${ORIGIN}'*) el_dir=${el_dir%%'${ORIGIN}'*}$el_origin${el_dir#*'${ORIGIN}'} ;;
        *'$ORIGIN'*) el_dir=${el_dir%%'$ORIGIN'*}$el_origin${el_dir#*'$ORIGIN'} ;;
        *) break ;;
        esac
      done
      printf '%s\n' "${el_dir:-.}"
    done
  done
}

# startup_changeable_by_others PREFIX PATH: as changeable_by_others, for PATH and
# everything the kernel and the dynamic loader run or load to start it before
# its own code runs: the interpreter of its `#!` line (for `env`, also the
# program env would find on root's PATH), that interpreter's in turn (the
# kernel allows 4), and for an ELF file its ELF interpreter and RUNPATH
# directories (elf_loads). Prints the first component others could change.
startup_changeable_by_others() {
  sc_pre=$1 sc_path=$2 sc_n=0
  while :; do
    changeable_by_others "$sc_pre" "$sc_path" && return 0
    sc_file=$sc_pre$sc_path
    sc_real=$(readlink -f "$sc_file" 2>/dev/null) || sc_real=$sc_file
    [ -z "$sc_pre" ] || sc_real=${sc_real#"$(cd "$sc_pre" && pwd -P)"}
    sc_deps=$(elf_loads "$sc_file" "${sc_real%/*}")
    while IFS= read -r sc_dep; do
      [ -n "$sc_dep" ] || continue
      changeable_by_others "$sc_pre" "$sc_dep" && return 0
    done <<SC_DEPS
$sc_deps
SC_DEPS
    [ "$(head -c 2 "$sc_file" 2>/dev/null)" = '#!' ] || return 1
    sc_n=$((sc_n + 1))
    if [ "$sc_n" -gt 4 ]; then printf -- '- -:- %s\n' "$(printable "$sc_path")"; return 0; fi
    # The kernel's reading of the line: the interpreter, then at most one argument.
    sc_line=$(head -n 1 "$sc_file" | cut -c3- | tr '\t' ' ')
    sc_line=${sc_line#"${sc_line%%[! ]*}"}
    sc_interp=${sc_line%% *} sc_arg=${sc_line#"$sc_interp"}
    sc_arg=${sc_arg#"${sc_arg%%[! ]*}"}
    sc_path=$sc_interp
    case ${sc_interp##*/}:$sc_arg in
    env:?*)
      changeable_by_others "$sc_pre" "$sc_interp" && return 0
      sc_arg=${sc_arg#-S }
      sc_found=$(command -v "${sc_arg%% *}" 2>/dev/null) || return 1
      case $sc_found in /*) ;; *) return 1 ;; esac
      sc_pre='' sc_path=$sc_found  # found on root's PATH: a path of this machine as it is
      ;;
    esac
  done
}

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
  if found=$(startup_changeable_by_others "$on" "$smi"); then
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
  if found=$(startup_changeable_by_others "$R" "$wanted"); then printf 'engine\t%s\tunsafe\t%s\n' "$name" "$found"; continue; fi
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
