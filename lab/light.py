"""The light lab host form, for the benchmark's large fleets only (`Lab(..., light=True)`; docs/test-hosts.md,
"Light hosts").

A light host is the same systemd-nspawn container as any lab host, with its real systemd, sshd, sudo, journald,
node scripts and agent test double, and four differences, each of which keeps what runs the same and only makes
it cost less memory:

- kernel samepage merging (KSM) of every page of every process in the container: the nspawn process starts with
  `prctl(PR_SET_MEMORY_MERGE, 1)`, which every process forked or executed in it inherits, and ksmd runs;
- address-space layout randomisation off in the container (`personality(ADDR_NO_RANDOMIZE)`, inherited the same
  way), so that the same program in two hosts lays out the same heap at the same addresses and KSM finds the pages
  alike (with ASLR each heap's pointers differ, and so do the pages);
- Python's string hashing seeded alike in every host (`PYTHONHASHSEED=0` in systemd's DefaultEnvironment, so in
  the agent's unit too): the agent double is the same program doing the same thing, but its dicts and sets are then
  laid out alike in every host, and KSM merges those pages too;
- D-Bus and systemd-logind masked: nothing the node scripts, sshd, sudo or systemctl need (systemctl as root talks
  to systemd's private socket), and without logind no per-user systemd is started for each SSH login.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab.linux import LabError

KSM = Path("/sys/kernel/mm/ksm")

#: prctl option that marks every present and future anonymous mapping of the process mergeable (Linux 6.4+);
#: kept over fork and, since Linux 6.7, over execve.
PR_SET_MEMORY_MERGE = 67
#: personality(2) flag: no address-space layout randomisation for this process and what it executes.
ADDR_NO_RANDOMIZE = 0x0040000
#: personality(2) argument that only reads the current persona.
PERSONALITY_QUERY = 0xFFFFFFFF

#: Units a light host masks on top of the base layer's (lab/base_layer.py, MASKED_UNITS).
MASKED_UNITS = (
    "dbus.service",
    "dbus.socket",
    "systemd-logind.service",
)

#: systemd drop-in of a light host (/etc/systemd/system.conf.d/): the environment every service starts with.
SYSTEM_DROPIN = """\
# Light lab host (lab/light.py): Python's hash seed alike in every host, so KSM can merge the agents' heaps.
[Manager]
DefaultEnvironment=PYTHONHASHSEED=0
"""

#: How many pages ksmd scans per wake-up (every `sleep_millisecs`, 20 ms by default) while a light lab runs: the
#: kernel's default of 100 (20 MB/s) would take minutes to cover a few hundred hosts' memory once.
PAGES_TO_SCAN = 1000

# Run by the venv's python as the first program of a light host's nspawn: mark the process's memory mergeable,
# turn ASLR off, then become the rest of the command line (the unshare and nspawn of lab/host.py), keeping the pid.
EXEC_PRELUDE = f"""\
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl({PR_SET_MEMORY_MERGE}, 1, 0, 0, 0) != 0:
    sys.exit("light host: prctl(PR_SET_MEMORY_MERGE) failed: " + os.strerror(ctypes.get_errno()))
persona = libc.personality({PERSONALITY_QUERY})
if persona == -1 or libc.personality(persona | {ADDR_NO_RANDOMIZE}) == -1:
    sys.exit("light host: personality(ADDR_NO_RANDOMIZE) failed: " + os.strerror(ctypes.get_errno()))
os.execvp(sys.argv[1], sys.argv[1:])
"""


def exec_prefix() -> list[str]:
    """The argv prefix that runs a command as the first process of a light host (see EXEC_PRELUDE)."""
    return [sys.executable, "-I", "-S", "-c", EXEC_PRELUDE]


class KsmUnavailable(LabError):
    """This kernel has no KSM, or ksmd cannot be started from here."""


def start_ksmd(pages_to_scan: int = PAGES_TO_SCAN) -> None:
    """Make ksmd run (`run` = 1) at `pages_to_scan` pages per wake-up at least.

    Left running afterwards: it scans only memory marked mergeable and sleeps while there is none. Raises
    KsmUnavailable, saying why, when /sys/kernel/mm/ksm is missing or not writable here.
    """
    run = KSM / "run"
    try:
        scan = KSM / "pages_to_scan"
        if int(scan.read_text()) < pages_to_scan:
            scan.write_text(f"{pages_to_scan}\n")
        run.write_text("1\n")
    except FileNotFoundError as e:
        raise KsmUnavailable(f"this kernel has no KSM ({KSM} is missing: CONFIG_KSM): {e}") from e
    except OSError as e:
        raise KsmUnavailable(f"cannot start ksmd: writing {run} failed ({e}); a light lab needs root on a "
                             f"machine whose /sys is writable") from e


def ksm_stat(pid: int) -> dict[str, str]:
    """/proc/<pid>/ksm_stat as a dict (`ksm_merge_any: yes` for a process whose memory is all mergeable);
    empty when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/ksm_stat").read_text()
    except OSError:
        return {}
    return parse_ksm_stat(text)


def parse_ksm_stat(text: str) -> dict[str, str]:
    """`ksm_rmap_items 12` and `ksm_merge_any: yes` lines as {name: value}."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.replace(":", " ", 1).partition(" ")
        if name:
            fields[name] = value.strip()
    return fields


def ksm_metadata_bytes(stat: dict[str, str]) -> int:
    """Kernel memory KSM spends tracking one process's pages (an rmap item per page scanned), from its ksm_stat.

    The kernel reports `ksm_process_profit` = merged pages x page size - rmap items x the rmap item's size, so the
    item's size need not be assumed. 0 for a process that is not merging.
    """
    try:
        merged, profit = int(stat["ksm_merging_pages"]), int(stat["ksm_process_profit"])
    except (KeyError, ValueError):
        return 0
    return max(0, merged * os.sysconf("SC_PAGE_SIZE") - profit)


@dataclass(frozen=True)
class KsmdSample:
    """ksmd's counters at one moment: its CPU and what it has merged (docs/benchmark-method.md)."""

    at: float
    cpu_seconds: float
    pages_sharing: int
    pages_shared: int
    full_scans: int

    @classmethod
    def now(cls) -> KsmdSample:
        def counter(name: str) -> int:
            return int((KSM / name).read_text())

        return cls(time.monotonic(), ksmd_cpu_seconds(), counter("pages_sharing"), counter("pages_shared"),
                   counter("full_scans"))

    @property
    def saved_mib(self) -> float:
        """Memory KSM saves now: `pages_sharing` counts the mappings of a merged page beyond its first one."""
        return self.pages_sharing * os.sysconf("SC_PAGE_SIZE") / 2**20


@functools.cache
def ksmd_pid() -> int | None:
    """The pid of the kernel thread ksmd, or None (no KSM in this kernel); looked up once."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if text[text.index("(") + 1:text.rindex(")")] == "ksmd":
            return int(stat.parent.name)
    return None


def ksmd_cpu_seconds() -> float:
    """ksmd's CPU so far (utime + stime of /proc/<ksmd>/stat); 0.0 without KSM."""
    pid = ksmd_pid()
    if pid is None:
        return 0.0
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


def stat_cpu_seconds(stat: str) -> float:
    """utime + stime, in seconds, of a /proc/<pid>/stat line (fields 14 and 15; the name in parentheses may hold
    spaces, so they are counted from its closing parenthesis)."""
    after = stat[stat.rindex(")") + 2:].split()
    return (int(after[11]) + int(after[12])) / os.sysconf("SC_CLK_TCK")
