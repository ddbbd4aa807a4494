"""A stand-in for ``journalctl``: the kernel log of a GPU node, for the node probe's Xid read.

The lab cannot put a line in a host's kernel log: every lab host shares the machine's one kernel. The node probe
(llmgw_pulumi/nodestate/scripts/probe-engines.sh, ``xid_lines``) reads the driver's Xid lines from the first root-owned,
root-only-writable ``/usr/bin/journalctl``, ``/bin/journalctl``, ``/usr/bin/dmesg`` or ``/bin/dmesg``, running a
journalctl twice: ``-k -b -q -n 0 --no-pager`` (can the journal be read at all?), then
``-k -b -q -o short-monotonic --no-pager`` (the kernel's lines since boot). This is a POSIX sh script answering
exactly those two the way journalctl does (nothing and exit 0; then each line as
``[SECONDS] HOSTNAME kernel: MESSAGE``); anything else was not recorded and fails, exit 1.

``build_journalctl(messages)`` prints ``messages`` as the kernel's, one second apart from boot +312 s. The
default, ``XID_79_BOOT``, is the driver loading, then the GPU at PCI 0000:00:06 (GPU 0 of the nvidia-smi stand-in,
lab/doubles/nvidia_smi.py) falling off the bus: Xid 79, in the driver's own line format (as in
tests/fixtures/xid/dmesg-T.txt, where another GPU falls off). Install it as root's ``/usr/bin/journalctl``, mode
0755, on a host only the test uses, or keep the real one aside and put it back.
"""

from __future__ import annotations

from collections.abc import Sequence

XID_79 = "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
"""GPU 0 of the nvidia-smi stand-in (PCI 00000000:00:06.0) gone from the bus: its driver's Xid line."""

XID_79_BOOT = (
    "nvidia: loading out-of-tree module taints kernel.",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04",
    "NVRM: GPU at PCI:0000:00:06: GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2",
    XID_79,
    "NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.",
)
"""A boot of the node whose GPU 0 fell off the bus: the kernel's messages, in order."""


def build_journalctl(messages: Sequence[str] = XID_79_BOOT, hostname: str = "gpu-node") -> str:
    """The stand-in's text: a journalctl whose kernel log since boot is ``messages``."""
    lines = "".join(f"[{312 + i:>5}.{i * 1013 % 1000000:06d}] {hostname} kernel: {m}\n" for i, m in enumerate(messages))
    assert "KLOG_END" not in lines
    return f"""#!/bin/sh
# journalctl stand-in (llmgw-pulumi lab, lab/doubles/kernel_log.py): the kernel log since boot, as recorded.
case "$*" in
'-k -b -q -n 0 --no-pager') exit 0 ;;
'-k -b -q -o short-monotonic --no-pager')
cat <<'KLOG_END'
{lines}KLOG_END
;;
*) echo "journalctl stand-in: this call was not recorded: $*" >&2; exit 1 ;;
esac
"""
