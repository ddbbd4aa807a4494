"""A stand-in for ``/sys/class/infiniband``: an HCA's directory with its ports' ``state``, ``phys_state`` and
``rate`` files, holding what the kernel's hold (tests/fixtures/infiniband/README.md lists the shapes).

The lab has no InfiniBand: a node's ``discovery.ibRoot`` points at a directory of these, which the probe reads
as it reads sysfs (``head -n 1`` of each file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PortState:
    """What one port's files say."""

    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"


ACTIVE = PortState()
"""A port in service: ACTIVE, LinkUp, NDR 4X."""
DOWN = PortState("1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)")
"""A port whose link is down (its cable pulled, or the switch port disabled), as the kernel reports it."""
SLOW = PortState(rate="200 Gb/sec (4X HDR)")
"""A port up at HDR, half of NDR's rate."""


def install_hca(ib_root: Path, hca: str, ports: dict[str, PortState] | None = None) -> Path:
    """``ib_root/hca`` with ``ports`` (port number -> its state; default: port 1 ACTIVE), each port's files
    written anew. Returns the HCA's directory."""
    directory = ib_root / hca
    for port, state in (ports or {"1": ACTIVE}).items():
        files = directory / "ports" / port
        files.mkdir(parents=True, exist_ok=True)
        for name, text in (("state", state.state), ("phys_state", state.phys_state), ("rate", state.rate)):
            (files / name).write_text(text + "\n")
    return directory
