"""What a real H200 node gave (tests/fixtures: its nvidia-smi report and InfiniBand sysfs tree), what the node
prints of the sysfs tree, that node as declared, and a mark for the tests that read all of ../shared/fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.doubles.nvidia_smi import FIXTURES as SHARED_FIXTURES
from llmgw_pulumi.health.readiness import Expectations

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL_XML = (FIXTURES / "nvidia-h200" / "nvidia-smi-q.xml").read_text()
"""The real node's `nvidia-smi -q -x`."""
UUID0 = "GPU-65decab1-06a8-ac78-1f56-8a52138b6ec2"
"""The real node's GPU 0, as its nvidia-smi names it."""
DECLARED = Expectations(gpu_count=1, gpu_model="NVIDIA H200", gpu_memory_mib=143771, min_driver="570",
                        min_cuda="12.8")
"""The real node, as README.md says it is declared."""
IB_ROOT = FIXTURES / "infiniband" / "sys" / "class" / "infiniband"
needs_fixtures = pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="shared/fixtures not beside the checkout")


def sysfs_lines(root: Path) -> str:
    """What the node prints for the ports under ``root`` (a /sys/class/infiniband): one ``ib-port`` line per port,
    each file's first line, as ``head -n1`` gives it."""
    out = []
    for port in sorted(root.glob("*/ports/*")):
        values = [(port / f).read_text().splitlines()[0] if (port / f).exists() else "" for f in
                  ("state", "phys_state", "rate")]
        out.append("\t".join(["ib-port", port.parent.parent.name, port.name, *values]))
    return "\n".join(out) + "\n"
