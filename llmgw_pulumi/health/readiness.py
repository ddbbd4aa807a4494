"""Is a GPU node ready? The verdict on what ``parsers`` parsed, against what was declared (pure).

``verdict`` compares a node's GPUs (``nvidia-smi -q -x``), the Xid events in
its kernel log and its InfiniBand ports with the declared ``Expectations``
and returns the ``Problem`` s it finds; ``readiness`` sums them up as
``ready``, ``degraded`` (warnings only) or ``not ready`` (a critical one).

Each problem names the node and what it is about (a GPU by index, UUID and
PCI bus id; an HCA port), what was found against what was expected, a
severity, and the fix: reset the GPU, reboot, reseat or service it, or fix
the fabric, with the commands quoted for the shell (``shlex``) as
``text.ssh_command`` quotes them. ``Problem.as_dict`` has the ``problem``
and ``hint`` keys of the engine and inventory problems.

What is declared, and how it is compared:

- ``gpu_count``: exactly; fewer GPUs than declared is critical (a GPU fell
  off or was not seated), more is a warning (the declaration is out of date).
- ``gpu_model``: the product name exactly as nvidia-smi prints it
  (``NVIDIA H200``), ignoring case and surrounding space. Not a substring:
  ``H100`` would match both ``NVIDIA H100 80GB HBM3`` and ``NVIDIA H100
  NVL``, which differ in memory and links, and that is what the check is
  there to tell apart.
- ``gpu_memory_mib``: the total nvidia-smi reports, within
  ``MEMORY_TOLERANCE`` (1 %). The total a driver reports moves by the memory
  it reserves for itself, which changes between driver versions by tens to
  hundreds of MiB; models that differ in memory differ by far more than 1 %
  (80 GB against 94 GB, 141 GB against 80 GB). Less than declared is
  critical (what was sized for the node does not fit), more is a warning.
- ``min_driver``, ``min_cuda``: dotted versions compared number by number
  (``580.159.04`` >= ``550.54.15``; ``13.0`` >= ``12.4``).
- per HCA: every port of it in the declared state (``ACTIVE``), physically
  up (``LinkUp``) and at least at the declared rate in Gb/s.

The GPU checks: ECC enabled and not about to change; no uncorrectable ECC
error since the driver loaded (volatile) nor before it (aggregate, beyond the
volatile ones it also counts); no pending row remap and no remap failure; no
channel or TPC repair pending and no unrepairable memory; the PCIe link at
its maximum width (critical) and generation (critical under load, a warning
on an idle GPU, which may lower its link generation to save power); no
hardware slowdown (a warning); persistence mode on (a warning). Each Xid
code in ``XID_CODES`` has its meaning and the action NVIDIA's Xid catalog
gives it; one whose action is a reset, a reboot or service is critical,
others are warnings.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from ..text import printable, ssh_command
from .parsers import GpuHealth, IbPort, SmiReport, XidEvent, parse_ib_ports, parse_smi_xml, parse_xid_events, pci_address

Severity = Literal["critical", "warning"]
CRITICAL: Severity = "critical"
WARNING: Severity = "warning"
Readiness = Literal["ready", "degraded", "not ready"]

MEMORY_TOLERANCE = 0.01
"""How far below (or above) the declared memory a GPU's reported total may be (see the module's docstring)."""


# --------------------------------------------------------------------------- what is declared


@dataclass(frozen=True)
class HcaExpectation:
    hca: str
    """As named under /sys/class/infiniband (mlx5_0)."""
    state: str = "ACTIVE"
    """What each port's ``state`` must say (its name: ACTIVE, DOWN, INIT, ARMED)."""
    min_rate_gbps: float = 0.0
    """The least ``rate`` a port may have, in Gb/s (400 for NDR 4X)."""


@dataclass(frozen=True)
class Expectations:
    """What a node was declared to have; None (or no HCA) is not declared, and not checked."""

    gpu_count: int | None = None
    gpu_model: str | None = None
    gpu_memory_mib: int | None = None
    min_driver: str | None = None
    min_cuda: str | None = None
    hcas: tuple[HcaExpectation, ...] = ()


def version_tuple(value: str) -> tuple[int, ...] | None:
    """``580.159.04`` as (580, 159, 4), so that versions compare as numbers; None when it is not dotted numbers."""
    value = value.strip()
    if not re.fullmatch(r"\d{1,9}(\.\d{1,9}){0,5}", value):
        return None
    return tuple(int(part) for part in value.split("."))


def at_least(have: str, least: str) -> bool:
    """``have`` is version ``least`` or a later one, compared number by number (``13.0`` is ``13``); a version that
    is not dotted numbers is never enough."""
    have_v, least_v = version_tuple(have), version_tuple(least)
    if have_v is None or least_v is None:
        return False
    width = max(len(have_v), len(least_v))
    return have_v + (0,) * (width - len(have_v)) >= least_v + (0,) * (width - len(least_v))


def _is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf")


def dotted_version(value: object) -> tuple[str, str] | None:
    """A validator of ``min_driver`` and ``min_cuda``, in the shape of ``validate``'s: None when ``value`` is a
    dotted version, else (what is wrong, the fix). A number is not one: YAML reads ``12.10`` as 12.1."""
    if isinstance(value, str) and version_tuple(value) is not None:
        return None
    return (f"{value!r} is not a version", "give dotted numbers as nvidia-smi prints them, e.g. 550.54.15 or 12.4, "
                                           "quoted in YAML ('12.4') so that they stay text")


def gpu_count(value: object) -> tuple[str, str] | None:
    """A validator of ``gpu_count``: a whole number, 0 or more."""
    if _is_number(value) and value == int(value) and 0 <= value <= 1024:
        return None
    return (f"{value!r} is not a number of GPUs",
            "give how many GPUs nvidia-smi must list on the node, a whole number such as 8 (0: none)")


def gpu_memory_mib(value: object) -> tuple[str, str] | None:
    """A validator of ``gpu_memory_mib``: a whole number of MiB above 0."""
    if _is_number(value) and value == int(value) and value >= 1:
        return None
    return (f"{value!r} is not an amount of memory in MiB",
            "give each GPU's total memory in MiB as nvidia-smi reports it (fb_memory_usage), e.g. 143771 for an H200")


def gpu_model(value: object) -> tuple[str, str] | None:
    """A validator of ``gpu_model``: the product name as nvidia-smi prints it, one line of text."""
    if isinstance(value, str) and value.strip() and value.isprintable() and len(value) <= 96:
        return None
    return (f"{value!r} is not a GPU model",
            "give the model exactly as `nvidia-smi --query-gpu=name --format=csv` prints it, e.g. NVIDIA H200")


PORT_STATES = ("ACTIVE", "ARMED", "INIT", "DOWN")
"""The names sysfs gives a port's ``state`` (after its number: ``4: ACTIVE``)."""


def port_state(value: object) -> tuple[str, str] | None:
    """A validator of a declared HCA port state: one of ``PORT_STATES``."""
    if isinstance(value, str) and value.strip().upper() in PORT_STATES:
        return None
    return (f"{value!r} is not a port state",
            f"give one of {', '.join(PORT_STATES)} (what /sys/class/infiniband/<hca>/ports/<n>/state names; "
            "a port in service is ACTIVE)")


def rate_gbps(value: object) -> tuple[str, str] | None:
    """A validator of a declared minimum port rate in Gb/s: a number above 0."""
    if _is_number(value) and 0 < value <= 100_000:
        return None
    return (f"{value!r} is not a rate in Gb/s",
            "give the least rate each port must have, in Gb/s as sysfs writes it: 400 for NDR 4X, 200 for HDR 4X")


# --------------------------------------------------------------------------- what is found


@dataclass(frozen=True)
class Problem:
    node: str
    subject: str
    """What it is about: ``GPU 0 (GPU-65de..., 00000000:00:06.0)``, ``mlx5_0 port 1``, ``NVIDIA driver``."""
    check: str
    """Which check found it (``ecc-disabled``, ``row-remap-pending``, ``xid``...): stable, for programs."""
    found: str
    expected: str
    severity: Severity
    fix: str

    @property
    def problem(self) -> str:
        return f"{self.subject} on {self.node}: {self.found}; expected {self.expected}"

    def as_dict(self) -> dict[str, str]:
        """The shape of EngineCheck's problems (``problem`` and ``hint``), with this problem's fields."""
        return {"check": self.check, "subject": self.subject, "severity": self.severity, "found": self.found,
                "expected": self.expected, "problem": self.problem, "hint": self.fix}


def readiness(problems: Iterable[Problem]) -> Readiness:
    """``not ready`` with a critical problem, ``degraded`` with warnings only, ``ready`` with none."""
    severities = {p.severity for p in problems}
    if CRITICAL in severities:
        return "not ready"
    return "degraded" if severities else "ready"


# --------------------------------------------------------------------------- Xid codes

Action = Literal["reset", "reboot", "service", "application", "monitor"]


@dataclass(frozen=True)
class XidMeaning:
    meaning: str
    action: Action
    """reset: reset the GPU; reboot: reboot the node; service: reseat or service the GPU; application: the
    application that was running should be restarted, the GPU itself needs nothing; monitor: nothing is needed
    now, but it may come before an error that does (a warning)."""


XID_CODES: dict[int, XidMeaning] = {
    13: XidMeaning("an exception in the graphics engine, usually the application's own fault", "application"),
    31: XidMeaning("a GPU memory page fault, usually an application reading memory it does not own", "application"),
    43: XidMeaning("the GPU stopped a channel of an application that faulted", "application"),
    45: XidMeaning("the driver ended an application's work on the GPU early (the application was stopped)",
                   "application"),
    48: XidMeaning("a double-bit (uncorrectable) ECC error in GPU memory", "reset"),
    62: XidMeaning("an internal micro-controller of the GPU halted", "reset"),
    63: XidMeaning("a row of GPU memory was marked for remapping (or a page for retirement); it takes effect at "
                   "the next GPU reset", "reset"),
    64: XidMeaning("a row remap (or page retirement) could not be recorded", "service"),
    74: XidMeaning("an NVLink error: a link between GPUs failed", "reset"),
    79: XidMeaning("the GPU has fallen off the bus: the host can no longer reach it over PCIe", "reboot"),
    92: XidMeaning("a high rate of single-bit (correctable) ECC errors, which were corrected", "monitor"),
    94: XidMeaning("a contained uncorrectable ECC error: only the application that hit it was affected",
                   "application"),
    95: XidMeaning("an uncontained uncorrectable ECC error: every application on the GPU was affected", "reset"),
    119: XidMeaning("a call to the GPU System Processor (GSP) firmware timed out", "reset"),
    120: XidMeaning("the GPU System Processor (GSP) firmware reported an error", "reset"),
    140: XidMeaning("an uncorrectable ECC error that the GPU could not recover from", "reset"),
    154: XidMeaning("the driver changed the GPU's recovery action: it says in the message what the GPU needs",
                    "reset"),
}
"""The Xid codes of data-center GPUs (Ampere and later) whose meaning is reported, in our words, with the action
NVIDIA's Xid catalog gives each: a reset, a reboot or service is critical, the application's a warning. A code not
here is reported as a warning, to be looked up in the catalog."""


# --------------------------------------------------------------------------- the verdict


def verdict(node: str, expect: Expectations, smi: SmiReport | None, xids: Sequence[XidEvent] = (),
            ports: Sequence[IbPort] = (), target: str = "") -> list[Problem]:
    """Every problem of ``node``: its GPUs in ``smi`` (None: the node has no nvidia-smi), the Xid events since it
    booted and its InfiniBand ports, against ``expect``. ``target`` is the node's SSH target for the fixes'
    commands (empty: the commands as typed on the node)."""
    v = _Verdict(printable(node), target)
    gpus: tuple[GpuHealth, ...] = ()
    if smi is not None and smi.error:
        v.add("nvidia-smi", "nvidia-smi-unreadable", f"nvidia-smi -q -x printed {smi.error}", "its XML report",
              CRITICAL, f"see what it prints: {v.command('nvidia-smi', '-q', '-x')}; usually the NVIDIA kernel module "
                        "is not loaded or does not match the driver (check dmesg, reinstall the driver)")
    else:
        gpus = smi.gpus if smi is not None else ()
        v.node_gpus(expect, smi, gpus)
        for gpu in gpus:
            v.gpu(expect, gpu)
    v.xid_events(xids, gpus)
    v.fabric(expect.hcas, ports)
    return v.problems


class _Verdict:
    def __init__(self, node: str, target: str) -> None:
        self.node = node
        self.target = target
        self.problems: list[Problem] = []

    def add(self, subject: str, check: str, found: str, expected: str, severity: Severity, fix: str) -> None:
        self.problems.append(Problem(self.node, subject, check, found, expected, severity, fix))

    def command(self, *argv: str) -> str:
        """``argv`` as the operator types it: through ``ssh`` to the node, or as is on it, quoted either way."""
        return ssh_command(self.target, *argv) if self.target else shlex.join(argv)

    # ---------------------------------------------------------------- fixes

    def reset(self, gpu_id: str, label: str) -> str:
        return (f"stop what runs on {label}, then reset it: {self.command('sudo', 'nvidia-smi', '-r', '-i', gpu_id)} "
                f"(or reboot {self.node})")

    def reboot(self) -> str:
        return f"reboot {self.node}: {self.command('sudo', 'systemctl', 'reboot')}"

    def service(self, label: str, why: str) -> str:
        return (f"take {self.node} out of service and have {label} reseated or serviced ({why}); "
                f"NVIDIA's RMA policy says when a GPU is replaced")

    # ---------------------------------------------------------------- node-wide

    def node_gpus(self, expect: Expectations, smi: SmiReport | None, gpus: Sequence[GpuHealth]) -> None:
        if expect.gpu_count is not None and len(gpus) != expect.gpu_count:
            fewer = len(gpus) < expect.gpu_count
            self.add("GPUs", "gpu-count", f"{len(gpus)} GPU(s)", f"{expect.gpu_count}", CRITICAL if fewer else WARNING,
                     f"list them: {self.command('nvidia-smi', '-L')}; a missing GPU usually needs a reboot, then "
                     "reseating or service" if fewer else "declare the node's GPU count as it is")
        driver = smi.driver_version if smi is not None else ""
        cuda = smi.cuda_version if smi is not None else ""
        for what, have, least, check, needs in (
                ("NVIDIA driver", driver, expect.min_driver, "driver-version", "of version {} or later"),
                ("CUDA version", cuda, expect.min_cuda, "cuda-version",
                 "that supports CUDA {} or later (the CUDA version nvidia-smi reports is the driver's)")):
            if least is not None and smi is not None and not at_least(have, least):
                self.add(what, check, have or "none reported", f"{least} or later", CRITICAL,
                         f"install an NVIDIA driver {needs.format(least)} on {self.node}, then reboot it")

    # ---------------------------------------------------------------- one GPU

    def gpu(self, expect: Expectations, g: GpuHealth) -> None:
        label = f"GPU {g.index}"
        subject = f"{label} ({g.uuid or 'no UUID'}, {g.pci_bus_id or 'no PCI bus id'})"
        gid = str(g.index)

        def add(check: str, found: str, expected: str, severity: Severity, fix: str) -> None:
            self.add(subject, check, found, expected, severity, fix)

        if expect.gpu_model is not None and g.product_name.strip().lower() != expect.gpu_model.strip().lower():
            add("gpu-model", f"model {g.product_name or '(none reported)'}", f"model {expect.gpu_model}", CRITICAL,
                "declare the model as nvidia-smi names it, or put this node where that model is declared")
        if expect.gpu_memory_mib is not None:
            declared = expect.gpu_memory_mib
            have = g.memory_total_mib
            if have is None or abs(have - declared) > declared * MEMORY_TOLERANCE:
                less = have is None or have < declared
                add("gpu-memory", f"{have} MiB of memory" if have is not None else "no memory total reported",
                    f"{declared} MiB (within {MEMORY_TOLERANCE:.0%})", CRITICAL if less else WARNING,
                    "declare the memory nvidia-smi reports (fb_memory_usage total), or check this is the model "
                    "declared")

        enable = self.command("sudo", "nvidia-smi", "-i", gid, "-e", "1")
        if g.ecc_current is None:
            add("ecc-unknown", "no ECC mode reported (N/A)", "ECC Enabled", WARNING,
                "use a GPU with ECC memory for serving, or accept that memory errors go unseen")
        elif g.ecc_current.lower() != "enabled":
            pending_on = (g.ecc_pending or "").lower() == "enabled"
            add("ecc-disabled", f"ECC {g.ecc_current} (pending {g.ecc_pending or 'N/A'})", "ECC Enabled", CRITICAL,
                self.reset(gid, label) if pending_on else f"enable it: {enable}, then {self.reset(gid, label)}")
        elif g.ecc_pending is not None and g.ecc_pending.lower() != "enabled":
            add("ecc-pending-change", f"ECC Enabled now, {g.ecc_pending} after the next reset", "ECC to stay Enabled",
                WARNING, f"keep it enabled: {enable}")

        for kind, counts, fix in (
                ("volatile", g.ecc_volatile, self.reset(gid, label)),
                ("aggregate", g.ecc_aggregate,
                 self.service(label, "its memory has had uncorrectable errors in its life; see "
                                     f"{self.command('nvidia-smi', '-q', '-i', gid, '-d', 'ECC,ROW_REMAPPER')}"))):
            # The aggregate counts the volatile errors too: it is a problem of its own for errors before them.
            before = (g.ecc_volatile.uncorrectable or 0) if kind == "aggregate" else 0
            if counts.uncorrectable and counts.uncorrectable > before:
                detail = ", ".join(f"{name} {n}" for name, n in counts.nonzero_uncorrectable())
                add(f"ecc-uncorrectable-{kind}", f"{counts.uncorrectable} uncorrectable {kind} ECC error(s) ({detail})",
                    f"no uncorrectable {kind} ECC error", CRITICAL, fix)

        rows = g.remapped_rows
        if rows.pending:
            add("row-remap-pending", "a row remap pending", "none pending", CRITICAL,
                f"the remap takes effect at the next reset: {self.reset(gid, label)}")
        if rows.failure:
            add("row-remap-failure", "a row remap failed (no spare row left)", "no remap failure", CRITICAL,
                self.service(label, "its memory has a row that could not be remapped"))
        for check, flag, what in (("channel-repair-pending", g.channel_repair_pending, "a channel repair pending"),
                                  ("tpc-repair-pending", g.tpc_repair_pending, "a TPC repair pending")):
            if flag:
                add(check, what, "none pending", CRITICAL, f"the repair is made at the next reset: {self.reset(gid, label)}")
        if g.unrepairable_memory:
            add("unrepairable-memory", "memory marked unrepairable", "no unrepairable memory", CRITICAL,
                self.service(label, "its memory has errors that cannot be repaired"))

        link = g.pcie
        if link.max_width and link.current_width is not None and link.current_width < link.max_width:
            add("pcie-width", f"PCIe link x{link.current_width}", f"x{link.max_width}", CRITICAL,
                self.service(label, "a narrower link than the slot has: reseat the card or its riser, check the slot"))
        if link.max_gen and link.current_gen is not None and link.current_gen < link.max_gen:
            if g.idle:
                add("pcie-gen", f"PCIe gen {link.current_gen} while idle", f"gen {link.max_gen}", WARNING,
                    "an idle GPU may lower its link generation to save power: check it again under load "
                    f"({self.command('nvidia-smi', '-q', '-i', gid, '-d', 'PERFORMANCE')} and pci_gpu_link_info)")
            else:
                add("pcie-gen", f"PCIe gen {link.current_gen} under load", f"gen {link.max_gen}", CRITICAL,
                    self.service(label, "a slower link than the slot has: reseat the card or its riser, check the "
                                        "slot and the BIOS's PCIe settings"))
        if g.clock_events_active:
            add("clock-slowdown", "clocks slowed by " + ", ".join(sorted(g.clock_events_active)), "no slowdown",
                WARNING, f"check the cooling and the power supply of {self.node}; "
                         f"{self.command('nvidia-smi', '-q', '-i', gid, '-d', 'PERFORMANCE')}")
        if g.persistence_mode is not None and g.persistence_mode.lower() != "enabled":
            add("persistence-mode", f"persistence mode {g.persistence_mode}", "Enabled", WARNING,
                f"run nvidia-persistenced, or: {self.command('sudo', 'nvidia-smi', '-i', gid, '-pm', '1')}")

    # ---------------------------------------------------------------- Xid events

    def xid_events(self, events: Sequence[XidEvent], gpus: Sequence[GpuHealth]) -> None:
        by_address = {pci_address(g.pci_bus_id): g for g in gpus}
        seen: dict[tuple[str, int], list[XidEvent]] = {}
        for e in events:
            seen.setdefault((e.pci_bus_id, e.code), []).append(e)
        for (bus, code), same in seen.items():
            address = pci_address(bus)
            gpu = by_address.get(address) if address else None
            if gpu is not None:
                label = f"GPU {gpu.index}"
                subject, gid = f"{label} ({gpu.uuid or 'no UUID'}, {gpu.pci_bus_id})", str(gpu.index)
            else:
                label = subject = f"the GPU at PCI {bus}"
                gid = f"{address[0]:08X}:{address[1]:02X}:{address[2]:02X}.0" if address else bus
            meaning = XID_CODES.get(code)
            times = f" ({len(same)} times)" if len(same) > 1 else ""
            last = same[-1].message
            found = f"Xid {code}{times} since boot: " + (meaning.meaning if meaning else "not a code this check knows")
            found += f" (the driver: {last!r})" if last else ""
            if meaning is None:
                self.add(subject, "xid", found, "no Xid since boot", WARNING,
                         f"look Xid {code} up in NVIDIA's Xid catalog; {self.command('sudo', 'dmesg')} shows the context")
                continue
            action = meaning.action
            if code == 154 and "reboot" in last.lower():  # the driver names the action: Reset Required, Node Reboot Required
                action = "reboot"
            fix = {"reset": self.reset(gid, label), "reboot": self.reboot(),
                   "service": self.service(label, f"Xid {code}"),
                   "application": "restart the application that was running; the GPU needs nothing unless it recurs "
                                  "with other applications",
                   "monitor": f"nothing now: watch {label} for an uncorrectable ECC error (Xid 48, 94, 95) or a row "
                              "remap failure (Xid 64), which would need it reset or serviced"}[action]
            if action == "reboot":
                fix += f"; if it happens again, {self.service(label, f'Xid {code} again')}"
            self.add(subject, "xid", found, "no Xid since boot", WARNING if action in ("application", "monitor") else CRITICAL,
                     fix)

    # ---------------------------------------------------------------- InfiniBand

    def fabric(self, hcas: Sequence[HcaExpectation], ports: Sequence[IbPort]) -> None:
        for want in hcas:
            mine = [p for p in ports if p.hca == want.hca]
            if not mine:
                self.add(want.hca, "ib-no-port", "no port read", f"its ports {want.state}", CRITICAL,
                         f"{self.command('ls', f'/sys/class/infiniband/{want.hca}/ports')}; check the HCA is there and "
                         "its driver (mlx5_core) is loaded")
                continue
            for p in mine:
                subject = f"{p.hca} port {p.port}"
                look = self.command("ibstat", p.hca, p.port)
                active = want.state.upper() == "ACTIVE"
                if active and (p.phys_state or "").lower() != "linkup":
                    self.add(subject, "ib-phys-state", f"physical state {p.phys_state or 'unreadable'}", "LinkUp",
                             CRITICAL, f"fix the fabric: check the cable, its transceivers and the switch port; {look}")
                elif (p.state or "").upper() != want.state.upper():
                    self.add(subject, "ib-state", f"state {p.state or 'unreadable'}", want.state, CRITICAL,
                             f"fix the fabric: a port that is up but not {want.state} usually waits for the subnet "
                             f"manager (is opensm, or the switch's, running?); {look}")
                elif active and want.min_rate_gbps > 0 and (p.rate_gbps is None or p.rate_gbps < want.min_rate_gbps):
                    self.add(subject, "ib-rate", f"rate {p.rate_text or 'unreadable'}",
                             f"at least {want.min_rate_gbps:g} Gb/sec", CRITICAL,
                             f"fix the fabric: a slower rate is usually a cable, transceiver or switch port that "
                             f"negotiated down; {look}")


# --------------------------------------------------------------------------- the probe's report (probe-engines.sh)

SMI_XML, XID_LINE = "smi-xml", "xid"
"""The probe's line kinds: ``smi-xml<TAB>LINE`` per line of ``nvidia-smi -q -x``, ``xid<TAB>LINE`` per kernel log
line with an Xid; its ``ib-port`` lines are ``parsers.parse_ib_ports``'."""


IB_PORT = "ib-port"
HEALTH_KINDS = (SMI_XML, XID_LINE, IB_PORT)


def health_lines(text: str) -> dict[str, list[str]]:
    """The probe's lines of each of ``HEALTH_KINDS``, without their kind, in one pass over its output."""
    out: dict[str, list[str]] = {kind: [] for kind in HEALTH_KINDS}
    for line in text.splitlines():
        kind, tab, rest = line.partition("\t")
        if tab and kind in out:
            out[kind].append(rest)
    return out


def other_lines(text: str) -> str:
    """The probe's lines that are not the health's: the engines and the inventory, for their own parsers (so that
    they need not read the few hundred KiB of an 8-GPU report)."""
    health = tuple(kind + "\t" for kind in HEALTH_KINDS)
    return "\n".join(line for line in text.splitlines() if not line.startswith(health))


def from_probe(node: str, expect: Expectations, text: str, smi_status: str, hcas: Sequence[str],
               target: str = "") -> list[Problem]:
    """The verdict on what probe-engines.sh printed: its nvidia-smi XML, Xid lines and InfiniBand ports.

    ``smi_status`` is the inventory's (``facts.Inventory.smi_status``): with ``ok`` the XML is read; with
    ``none`` the node has no nvidia-smi (so no GPU: a declared count is a problem); otherwise nvidia-smi is
    missing, failing or unsafe, which the inventory reports itself, so no GPU is judged here. ``hcas`` are the
    HCAs the node has: a declared one it lacks is the inventory's problem too, not a port problem here."""
    lines = health_lines(text)
    if smi_status == "ok":
        xml = "\n".join(lines[SMI_XML])
        smi: SmiReport | None = parse_smi_xml(xml) if xml.strip() else SmiReport(error="nothing (no XML)")
    else:
        smi = None
        if smi_status != "none":
            expect = dataclasses.replace(expect, gpu_count=None)
    present = set(hcas)
    expect = dataclasses.replace(expect, hcas=tuple(h for h in expect.hcas if h.hca in present))
    ports = parse_ib_ports("\n".join(f"{IB_PORT}\t{line}" for line in lines[IB_PORT]))
    return verdict(node, expect, smi, parse_xid_events("\n".join(lines[XID_LINE])), ports, target)


def severity_of(problem: Mapping[str, Any]) -> Severity:
    """A problem's severity as an output records it; a problem recorded before problems had one (an engine's,
    nvidia-smi's, a missing HCA's) is critical."""
    return WARNING if problem.get("severity") == WARNING else CRITICAL


def readiness_of(problems: Iterable[Mapping[str, Any]] | None) -> Readiness:
    """``readiness`` of the problems as EngineCheck records them (dicts)."""
    severities = {severity_of(p) for p in problems or ()}
    if CRITICAL in severities:
        return "not ready"
    return "degraded" if severities else "ready"
