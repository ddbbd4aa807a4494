"""What a GPU node prints about its health, parsed (pure): ``nvidia-smi -q -x``, the driver's Xid lines in the
kernel log, and the state of its InfiniBand ports under ``/sys/class/infiniband``.

The parsers here only read; what counts as healthy is ``readiness``'s. Each
takes text a node printed and never raises on it: an element nvidia-smi adds
in a later driver is ignored, one it leaves out (or reports as ``N/A``) is
None, and text that is not nvidia-smi's XML, or XML without a GPU, is a
``SmiReport`` whose ``error`` says so.

The XML is a node's, so it is parsed as untrusted: nvidia-smi's own document
type line (``<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">``, a
name and an external identifier, nothing more) is dropped, and any other
DOCTYPE, any ENTITY declaration or an internal subset is refused before the
parser sees the text, so no entity is ever expanded and no file is ever
read. Every string kept is made printable (``text.printable``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from ..text import printable

MAX_SMI_XML_CHARS = 16 * 1024 * 1024
"""Larger than this is not nvidia-smi's report of one node (an 8-GPU report is a few hundred KiB)."""

_SMI_DOCTYPE = re.compile(r"""<!DOCTYPE\s+[A-Za-z_][\w.-]*(\s+(SYSTEM|PUBLIC)(\s+("[^"<>\[]*"|'[^'<>\[]*')){1,2})?\s*>""")
"""A document type line that names the root and, at most, an external DTD: nvidia-smi's. No internal subset."""
_DECLARATION = re.compile(r"<!\s*(DOCTYPE|ENTITY|ELEMENT|ATTLIST|NOTATION)", re.IGNORECASE)
_NOT_AVAILABLE = {"", "n/a", "not available", "not supported", "[n/a]", "unknown error", "[unknown error]"}


# --------------------------------------------------------------------------- nvidia-smi -q -x


@dataclass(frozen=True)
class EccCounts:
    """One of nvidia-smi's ECC error counters (``volatile``: since the driver loaded; ``aggregate``: the GPU's
    life). ``correctable``/``uncorrectable``: the sums of the counters of each kind nvidia-smi printed (None when it
    printed none of them); ``counters``: each counter that was a number, by its element name."""

    correctable: int | None = None
    uncorrectable: int | None = None
    counters: tuple[tuple[str, int], ...] = ()

    def nonzero_uncorrectable(self) -> tuple[tuple[str, int], ...]:
        return tuple((name, n) for name, n in self.counters if _uncorrectable(name) and n)


@dataclass(frozen=True)
class RemappedRows:
    """``remapped_rows``: rows of GPU memory replaced by spare rows after errors (Ampere and later)."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    """A remap is recorded and takes effect at the next GPU reset."""
    failure: bool | None = None
    """A remap could not be made: no spare row was left."""


@dataclass(frozen=True)
class PcieLink:
    max_gen: int | None = None
    current_gen: int | None = None
    max_width: int | None = None
    current_width: int | None = None


CLOCK_EVENT_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
"""The clock event reasons read (``clocks_event_reason_<name>``; drivers before 535 say ``clocks_throttle_reason_``):
each slows the GPU for a reason of the machine, not of its load."""


@dataclass(frozen=True)
class GpuHealth:
    """One GPU of ``nvidia-smi -q -x``."""

    index: int
    """Its place in nvidia-smi's list: the index ``nvidia-smi -i`` takes."""
    minor_number: int | None
    """N of /dev/nvidiaN (usually, not always, equal to ``index``)."""
    uuid: str
    pci_bus_id: str
    product_name: str
    memory_total_mib: int | None
    driver_version: str
    cuda_version: str
    ecc_current: str | None
    """Enabled or Disabled; None where nvidia-smi says N/A (a GPU without ECC)."""
    ecc_pending: str | None
    """What ECC will be after the next reset."""
    ecc_volatile: EccCounts
    ecc_aggregate: EccCounts
    remapped_rows: RemappedRows
    channel_repair_pending: bool | None
    tpc_repair_pending: bool | None
    unrepairable_memory: bool | None
    pcie: PcieLink
    clock_events_active: frozenset[str]
    """The names of ``CLOCK_EVENT_REASONS`` nvidia-smi reports Active."""
    clock_idle: bool | None
    """The ``gpu_idle`` clock event reason: Active when nothing runs on the GPU."""
    persistence_mode: str | None
    gpu_util_percent: int | None

    @property
    def idle(self) -> bool:
        """Nothing runs on it: its clocks say idle, or its utilisation is 0 %."""
        return bool(self.clock_idle) or self.gpu_util_percent == 0


@dataclass(frozen=True)
class SmiReport:
    """``nvidia-smi -q -x`` as parsed: its GPUs, or why there are none (``error``)."""

    driver_version: str = ""
    cuda_version: str = ""
    gpus: tuple[GpuHealth, ...] = ()
    error: str = ""
    """Empty when the text was nvidia-smi's XML with at least one GPU; otherwise what it was instead."""


def parse_smi_xml(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q -x``; never raises on what a node printed (see the module's docstring)."""
    root, error = _safe_root(text)
    if root is None:
        return SmiReport(error=error)
    if root.tag != "nvidia_smi_log":
        return SmiReport(error=f"XML whose root is <{printable(root.tag)[:64]}>, not nvidia-smi's <nvidia_smi_log>")
    driver = _text(root, "driver_version") or ""
    cuda = _text(root, "cuda_version") or ""
    gpus = tuple(_gpu(i, el, driver, cuda) for i, el in enumerate(root.findall("gpu")))
    if not gpus:
        return SmiReport(driver, cuda, error="nvidia-smi's XML lists no GPU")
    return SmiReport(driver, cuda, gpus)


def _safe_root(text: str) -> tuple[ET.Element | None, str]:
    if len(text) > MAX_SMI_XML_CHARS:
        return None, f"{len(text)} characters, more than nvidia-smi prints for one node ({MAX_SMI_XML_CHARS})"
    body = _SMI_DOCTYPE.sub("", text, count=1)
    if m := _DECLARATION.search(body):
        return None, f"XML that declares a DTD or entities ({printable(m.group(0))}...): refused unparsed"
    if not body.strip():
        return None, "nothing (no XML)"
    try:
        return ET.fromstring(body), ""
    except ET.ParseError as exc:
        first = printable(text.strip().splitlines()[0][:120]) if text.strip() else ""
        return None, f"not XML ({printable(str(exc))}): it begins {first!r}"


def _text(el: ET.Element | None, path: str) -> str | None:
    """The stripped, printable text at ``path`` under ``el``; None when absent or N/A."""
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    value = printable(" ".join(found.text.split()))
    return None if value.lower() in _NOT_AVAILABLE else value


def _number(value: str | None) -> int | None:
    """The leading whole number of ``'143771 MiB'``, ``'16x'``, ``'0 %'``; None when there is none."""
    m = re.match(r"\d+", value or "")
    return int(m.group(0)) if m else None


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    low = value.lower()
    if low in ("yes", "active", "enabled", "true"):
        return True
    if low in ("no", "not active", "disabled", "false", "none"):
        return False
    return None


def _uncorrectable(name: str) -> bool:
    return "uncorrectable" in name or name.startswith("double_bit")


def _ecc_counts(el: ET.Element | None) -> EccCounts:
    """The counters under ``volatile`` or ``aggregate``: ``sram_correctable``, ``dram_uncorrectable``,
    ``sram_uncorrectable_parity`` (and, from older drivers, ``single_bit/device_memory``...)."""
    if el is None:
        return EccCounts()
    counters: list[tuple[str, int]] = []
    for child in el:
        # Drivers before Ampere group counters (single_bit/device_memory, ..., single_bit/total): their total is enough.
        group = [leaf for leaf in child if leaf.tag == "total"] or list(child)
        leaves = [(f"{child.tag}_{leaf.tag}", leaf) for leaf in group] if len(child) else [(child.tag, child)]
        for name, leaf in leaves:
            if "correctable" not in name and not name.startswith(("single_bit", "double_bit")):
                continue
            if (n := _number(_text(leaf, "."))) is not None:
                counters.append((name, n))
    unc = [n for name, n in counters if _uncorrectable(name)]
    corr = [n for name, n in counters if not _uncorrectable(name)]
    return EccCounts(sum(corr) if corr else None, sum(unc) if unc else None, tuple(counters))


def _gpu(index: int, el: ET.Element, driver: str, cuda: str) -> GpuHealth:
    ecc = el.find("ecc_errors")
    rows = el.find("remapped_rows")
    link = el.find("pci/pci_gpu_link_info")
    reasons = el.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons is None:
        reasons, prefix = el.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    return GpuHealth(
        index=index,
        minor_number=_number(_text(el, "minor_number")),
        uuid=_text(el, "uuid") or "",
        pci_bus_id=_text(el, "pci/pci_bus_id") or printable(el.get("id", "")),
        product_name=_text(el, "product_name") or "",
        memory_total_mib=_number(_text(el, "fb_memory_usage/total")),
        driver_version=driver,
        cuda_version=cuda,
        ecc_current=_text(el, "ecc_mode/current_ecc"),
        ecc_pending=_text(el, "ecc_mode/pending_ecc"),
        ecc_volatile=_ecc_counts(ecc.find("volatile") if ecc is not None else None),
        ecc_aggregate=_ecc_counts(ecc.find("aggregate") if ecc is not None else None),
        remapped_rows=RemappedRows(
            correctable=_number(_text(rows, "remapped_row_corr")),
            uncorrectable=_number(_text(rows, "remapped_row_unc")),
            pending=_yes(_text(rows, "remapped_row_pending")),
            failure=_yes(_text(rows, "remapped_row_failure")),
        ),
        channel_repair_pending=_yes(_text(ecc, "channel_repair_pending")),
        tpc_repair_pending=_yes(_text(ecc, "tpc_repair_pending")),
        unrepairable_memory=_yes(_text(ecc, "unrepairable_memory")),
        pcie=PcieLink(
            max_gen=_number(_text(link, "pcie_gen/max_link_gen")),
            current_gen=_number(_text(link, "pcie_gen/current_link_gen")),
            max_width=_number(_text(link, "link_widths/max_link_width")),
            current_width=_number(_text(link, "link_widths/current_link_width")),
        ),
        clock_events_active=frozenset(r for r in CLOCK_EVENT_REASONS if _yes(_text(reasons, prefix + r))),
        clock_idle=_yes(_text(reasons, prefix + "gpu_idle")),
        persistence_mode=_text(el, "persistence_mode"),
        gpu_util_percent=_number(_text(el, "utilization/gpu_util")),
    )


# --------------------------------------------------------------------------- Xid events in the kernel log

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
                  r"(?P<code>\d{1,5})(?:,\s*(?P<rest>.*))?")
_PID_OR_NAME = re.compile(r"\A(?:pid|name)=('[^']*'|[^,]*),\s*")


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.`` line."""

    code: int
    pci_bus_id: str
    """As the driver prints it: domain:bus:device (``0000:18:00``)."""
    message: str
    """What follows the code, without the pid= and name= fields."""


def parse_xid_events(text: str) -> tuple[XidEvent, ...]:
    """Every Xid line in kernel log text (``dmesg``, ``journalctl -k``: any prefix), in order; other lines are
    ignored."""
    out = []
    for line in printable(text, keep="\n").splitlines():
        if m := _XID.search(line):
            rest = (m.group("rest") or "").strip()
            while p := _PID_OR_NAME.match(rest):
                rest = rest[p.end():]
            out.append(XidEvent(int(m.group("code")), m.group("bus"), rest))
    return tuple(out)


def pci_address(bus_id: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI bus id as nvidia-smi (``00000000:18:00.0``) or an Xid line (``0000:18:00``)
    writes it, so the two can be compared; None when it is neither."""
    m = re.fullmatch(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?", bus_id.strip())
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


# --------------------------------------------------------------------------- InfiniBand ports (sysfs)


@dataclass(frozen=True)
class IbPort:
    """One port of an HCA as sysfs shows it (``/sys/class/infiniband/<hca>/ports/<port>/``)."""

    hca: str
    port: str
    state: str | None
    """``state``'s name: ACTIVE, DOWN, INIT, ARMED...; None when unreadable."""
    phys_state: str | None
    """``phys_state``'s name: LinkUp, Disabled, Polling...; None when unreadable."""
    rate_gbps: float | None
    """``rate`` in Gb/s (``400 Gb/sec (4X NDR)`` is 400.0); None when unreadable."""
    rate_text: str = ""
    """``rate`` as the node printed it."""


def sysfs_enum(value: str) -> str | None:
    """The name in a sysfs ``<number>: <name>`` value (``4: ACTIVE`` is ACTIVE); None when it is not one."""
    m = re.fullmatch(r"\s*\d+\s*:\s*([A-Za-z][\w -]*?)\s*", value)
    return printable(m.group(1)) if m else None


def sysfs_rate_gbps(value: str) -> float | None:
    """Gb/s of a sysfs ``rate`` (``400 Gb/sec (4X NDR)``, ``2.5 Gb/sec (1X SDR)``); None when it is not one."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec\b", value)
    return float(m.group(1)) if m else None


def parse_ib_ports(text: str) -> tuple[IbPort, ...]:
    """``ib-port<TAB>HCA<TAB>PORT<TAB>STATE<TAB>PHYS_STATE<TAB>RATE`` lines (each a sysfs file's first line, or
    empty where the file could not be read); other lines are ignored."""
    out = []
    for line in printable(text, keep="\t\n").splitlines():
        parts = line.split("\t")
        if parts[0] != "ib-port" or len(parts) != 6:
            continue
        _, hca, port, state, phys, rate = (printable(p) for p in parts)
        out.append(IbPort(hca, port, sysfs_enum(state), sysfs_enum(phys), sysfs_rate_gbps(rate), rate.strip()))
    return tuple(out)
