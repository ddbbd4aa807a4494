"""What a node looks like now: pure parsers of the output of remote scripts.

``NodeFacts`` is the one shape of observed state: per path its sha256, mode
and owner, and the agent unit's active/enabled state. The survey (refresh)
and the install scripts (what they just installed) both print it.

Each parser takes the text a script printed and returns a small frozen value.
They are tested on recorded output (and, for GPU discovery, on the real
nvidia-smi output from an H200 node in the fixtures).

This is where what a node prints enters the operator's side, so every parser
first makes it printable (``text.printable``): no value parsed here holds a
control character, an escape sequence or a bidirectional override, whatever
the node printed; only the tabs and newlines that separate its fields are
read as such. The fix hints that are shell commands quote what they
interpolate (``shlex.quote``), for the operator's shell and the node's.
"""

from __future__ import annotations

import base64
import csv
import io
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..text import printable, ssh_command
from .desired import NodeFile

ABSENT = "absent"
CRITICAL = "critical"
"""The severity of every engine and inventory problem: the node is not ready (``readiness.CRITICAL``)."""


def from_node(text: str) -> str:
    """What a script printed, with every character that is not printable escaped but the tabs and
    newlines that structure it: split into fields, it holds no control character."""
    return printable(text, keep="\t\n")


def key_values(text: str) -> dict[str, str]:
    """``key<TAB>value`` lines; later keys win; other lines are ignored. A tab in a value is shown as ``\\t``."""
    out: dict[str, str] = {}
    for line in from_node(text).splitlines():
        key, sep, value = line.partition("\t")
        if sep:
            out[key] = printable(value)
    return out


@dataclass(frozen=True)
class FileFact:
    path: str
    mode: int
    owner: str
    group: str
    sha256: str


@dataclass(frozen=True)
class NodeFacts:
    hostname: str
    arch: str
    unit_active: str
    """systemctl is-active: active, inactive, failed, activating, or '' when unknown."""
    unit_enabled: str
    files: dict[str, FileFact | None] = field(default_factory=dict)
    """Every surveyed path; None where the file does not exist."""
    texts: dict[str, str] = field(default_factory=dict)
    """The text of the files surveyed with their text (see remote.survey), where they exist."""

    def sha256(self, path: str) -> str | None:
        f = self.files.get(path)
        return f.sha256 if f else None

    def state(self, want: NodeFile) -> str:
        """How the providers record a file they installed (see ``file_state``)."""
        return file_state(want, self.files.get(want.path))


def file_state(want: NodeFile, seen: FileFact | None) -> str:
    """A file as seen on the node, in one comparable string: its sha256 when its mode and owner are as
    ``want`` says, ``absent`` when it is not there, and otherwise its sha256 followed by what is wrong.

    The providers record this per file, and compare it with the sha256 of what
    the file should hold: any difference (content, mode, owner) is drift, and
    `pulumi refresh --diff` shows which.
    """
    if seen is None:
        return ABSENT
    wrong = []
    if seen.mode != want.mode:
        wrong.append(f"mode {seen.mode:04o}, not {want.mode:04o}")
    if f"{seen.owner}:{seen.group}" != want.owner:
        wrong.append(f"owner {seen.owner}:{seen.group}, not {want.owner}")
    return seen.sha256 + "".join(f"; {w}" for w in wrong)


def parse_survey(text: str) -> NodeFacts:
    """What survey.sh prints; the install scripts end with the same lines for what they installed.

    A line that does not parse is left out (a file it names counts as absent), as any other line is."""
    head: dict[str, str] = {}
    files: dict[str, FileFact | None] = {}
    texts: dict[str, str] = {}
    for line in from_node(text).splitlines():
        parts = line.split("\t")
        if parts[0] == "text" and len(parts) == 3:
            try:
                texts[parts[1]] = from_node(base64.b64decode(parts[2]).decode(errors="replace"))
            except ValueError:  # not base64 (binascii.Error), or not ASCII
                continue
        elif parts[0] == "file" and len(parts) >= 3:
            path = parts[1]
            if parts[2] == "-":
                files[path] = None
            elif len(parts) == 4 and (seen := _file_fact(path, parts[2], parts[3])):
                files[path] = seen
        elif len(parts) == 2:
            head[parts[0]] = parts[1]
    return NodeFacts(
        hostname=head.get("hostname", ""),
        arch=head.get("arch", ""),
        unit_active=head.get("active", ""),
        unit_enabled=head.get("enabled", ""),
        files=files,
        texts=texts,
    )


def _file_fact(path: str, mode_owner_group: str, sha256: str) -> FileFact | None:
    """A ``file`` line's fields ('600 root root', the sha256), or None where they do not parse."""
    words = mode_owner_group.split(" ")
    if len(words) != 3 or not re.fullmatch(r"[0-7]{1,6}", words[0]):
        return None
    return FileFact(path, int(words[0], 8), words[1], words[2], sha256)


@dataclass(frozen=True)
class EngineProbe:
    engine: str
    path: str
    status: str
    """runs, missing, not-executable, fails or unsafe (see ``changeable_problem``)."""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "runs"


def parse_engine_probes(text: str, engines: tuple[tuple[str, str], ...]) -> list[EngineProbe]:
    paths = dict(engines)
    out = []
    for line in from_node(text).splitlines():
        parts = line.split("\t")
        if parts[0] == "engine" and len(parts) >= 3 and parts[1] in paths:
            out.append(EngineProbe(parts[1], paths[parts[1]], parts[2], parts[3].strip() if len(parts) > 3 else ""))
    return out


def engine_problem(probe: EngineProbe, node: str, target: str) -> dict[str, str] | None:
    """The operator-facing report for one engine: what is wrong and what to run (SPEC step 7)."""
    if probe.ok:
        return None
    if probe.status == UNSAFE:
        return {"engine": probe.engine, "path": probe.path, "status": probe.status, "severity": CRITICAL,
                **changeable_problem(probe.engine, probe.path, probe.detail, node, target)}
    if probe.status == "missing":
        problem = f"{probe.engine} is configured at {probe.path}, which does not exist on {node}"
        hint = f"install {probe.engine} there, or fix engines.{probe.engine} in the stack config"
    elif probe.status == "not-executable":
        problem = f"{probe.engine} at {probe.path} is not an executable file on {node} ({probe.detail})"
        hint = ssh_command(target, "sudo", "chmod", "0755", probe.path)
    else:
        problem = f"{probe.engine} at {probe.path} exists but will not run on {node} ({probe.detail})"
        hint = f"usually a missing shared library: {ssh_command(target, 'ldd', probe.path)} | grep 'not found'"
    return {"engine": probe.engine, "path": probe.path, "status": probe.status, "severity": CRITICAL,
            "problem": problem, "hint": hint}


# --------------------------------------------------------------------------- GPU discovery


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    driver_version: str
    pci_bus_id: str
    compute_cap: str


GPU_QUERY_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "pci.bus_id", "compute_cap")
"""The fields asked for with ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``."""


def parse_gpu_query(text: str, fields: tuple[str, ...] = GPU_QUERY_FIELDS) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header the columns are taken from it (``memory.total [MiB]`` names
    ``memory.total``); without one, ``fields`` says what was asked for, in
    order. Unit suffixes (`` MiB``) are dropped. A bad field makes nvidia-smi
    print an error instead of CSV; it is raised as ValueError in nvidia-smi's
    own words.
    """
    text = from_node(text)
    # A quoted CSV field may span lines: each field is made printable again, newlines and all.
    rows = [[printable(c.strip()) for c in r] for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    if rows and rows[0][0].startswith("Field "):
        raise ValueError(text.strip().splitlines()[0])
    if rows and rows[0][0] == "index":
        fields = tuple(h.split(" [")[0] for h in rows[0])
        rows = rows[1:]
    gpus = []
    for row in rows:
        if len(row) != len(fields):
            raise ValueError(f"nvidia-smi gave {len(row)} columns for {len(fields)} fields: {','.join(row)!r}")
        v = dict(zip(fields, row, strict=True))
        try:
            gpus.append(Gpu(int(v["index"]), v["uuid"], v["name"], int(v["memory.total"].split()[0]),
                            v["driver_version"], v["pci.bus_id"], v["compute_cap"]))
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"nvidia-smi gave a row that does not parse: {','.join(row)!r}") from None
    return gpus


def parse_gpu_list(text: str) -> list[tuple[int, str, str]]:
    """``nvidia-smi -L``: (index, name, uuid) per GPU."""
    out = []
    for line in from_node(text).splitlines():
        if not line.startswith("GPU "):
            continue
        head, _, rest = line.partition(": ")
        name, _, uuid = rest.rpartition(" (UUID: ")
        index = head.split()[1:2]
        if index and index[0].isascii() and index[0].isdigit():
            out.append((int(index[0]), name, uuid.rstrip(")")))
    return out


# --------------------------------------------------------------------------- inventory (probe-engines.sh)

INVENTORY_QUERY_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version", "pci.bus_id",
                          "compute_cap")
"""What the inventory asks nvidia-smi for (``--format=csv,noheader,nounits``): the fields of ``Gpu``, and
memory.used, as the fixtures of a real H200 were captured."""

_SMI_HEADER = re.compile(r"Driver Version:\s*(?P<driver>\S+)\s+CUDA Version:\s*(?P<cuda>\S+)")


@dataclass(frozen=True)
class Inventory:
    """What hardware a node has: its GPUs (from nvidia-smi) and its InfiniBand HCAs (from sysfs)."""

    gpus: tuple[Gpu, ...] = ()
    driver: str = ""
    cuda: str = ""
    hcas: tuple[str, ...] = ()
    smi_status: str = "none"
    """ok, none (not on PATH, not configured), missing (configured, not there), fails, or unsafe (not run:
    see ``changeable_problem``)."""
    smi_path: str = ""
    smi_detail: str = ""

    def as_output(self) -> dict[str, Any]:
        """The EngineCheck output ``inventory``."""
        return {
            "gpus": [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib, "uuid": g.uuid,
                      "pci_bus_id": g.pci_bus_id, "compute_cap": g.compute_cap} for g in self.gpus],
            "driver": self.driver,
            "cuda": self.cuda,
            "hcas": list(self.hcas),
        }


def parse_inventory(text: str) -> Inventory:
    """The ``smi``, ``gpu``, ``smi-header`` and ``hca`` lines probe-engines.sh prints.

    The GPUs are nvidia-smi's CSV rows for INVENTORY_QUERY_FIELDS; the driver
    and CUDA versions come from the header of plain ``nvidia-smi`` (the CSV has
    no CUDA version), the driver from the CSV when the header lacks it. CSV that
    does not parse makes nvidia-smi count as failing, in the parser's words.
    """
    status, path, detail, header = "none", "", "", ""
    rows: list[str] = []
    hcas: list[str] = []
    for line in from_node(text).splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "smi":
            status, _, more = rest.partition("\t")
            path, _, detail = more.partition("\t")
        elif kind == "gpu":
            rows.append(rest)
        elif kind == "smi-header":
            header = rest
        elif kind == "hca" and rest:
            hcas.append(printable(rest))
    gpus: list[Gpu] = []
    if status == "ok":
        try:
            gpus = parse_gpu_query("\n".join(rows), INVENTORY_QUERY_FIELDS)
        except ValueError as exc:
            status, detail = "fails", f"unreadable output: {exc}"
    m = _SMI_HEADER.search(header)
    driver = m["driver"] if m else next((g.driver_version for g in gpus), "")
    return Inventory(tuple(gpus), driver, m["cuda"] if m else "", tuple(sorted(hcas)), status, path,
                     printable(detail.strip()))


def inventory_problems(inv: Inventory, fabrics: Sequence[tuple[str, Sequence[str]]], ib_root: str, node: str,
                       target: str) -> list[dict[str, str]]:
    """What is wrong with the node's hardware, reported as engine problems are (``problem`` and ``hint``):
    nvidia-smi that is configured but absent, or fails; a declared fabric HCA the node lacks."""
    out = []
    if inv.smi_status == UNSAFE:
        out.append({"gpu": "nvidia-smi", "path": inv.smi_path, "status": UNSAFE, "severity": CRITICAL,
                    **changeable_problem("nvidia-smi", inv.smi_path, inv.smi_detail, node, target)})
    elif inv.smi_status == "missing":
        out.append({"gpu": "nvidia-smi", "path": inv.smi_path, "status": "missing", "severity": CRITICAL,
                    "problem": f"nvidia-smi is configured at {inv.smi_path}, which does not exist on {node}",
                    "hint": "install the NVIDIA driver utilities there, or fix discovery.nvidiaSmi in the stack config"})
    elif inv.smi_status == "fails":
        out.append({"gpu": "nvidia-smi", "path": inv.smi_path, "status": "fails", "severity": CRITICAL,
                    "problem": f"nvidia-smi at {inv.smi_path} fails on {node} ({inv.smi_detail}): "
                               "its GPUs are not usable",
                    "hint": f"{ssh_command(target, inv.smi_path)}; usually the NVIDIA kernel module is not loaded or does "
                            "not match the driver (check dmesg, reinstall the driver for the running kernel)"})
    for fabric, hcas in fabrics:
        for hca in hcas:
            if hca not in inv.hcas:
                found = ", ".join(inv.hcas) or "none"
                out.append({"fabric": fabric, "hca": hca, "status": "missing", "severity": CRITICAL,
                            "problem": f"fabric {fabric} declares HCA {hca}, which {node} does not have "
                                       f"(under {ib_root}: {found})",
                            "hint": f"{ssh_command(target, 'ls', ib_root)}; list the node's HCAs in fabric.hcas, "
                                    "or check the HCA's driver (mlx5_core) is loaded"})
    return out


# --------------------------------------------------------------------------- paths others could change (probe-engines.sh)

UNSAFE = "unsafe"
"""The probe's status for an engine or nvidia-smi it did not run: a user other than root could change it."""


def changeable_problem(what: str, path: str, detail: str, node: str, target: str) -> dict[str, str]:
    """The report for ``what`` at ``path``, which the probe did not run as root because a user other than root
    could change it: ``detail`` is the first such component, as prelude.sh's ``changeable_by_others`` prints
    it (``MODE OWNER:GROUP COMPONENT``). The fix makes that component root's alone."""
    mode, owner, component = (detail.split(" ", 2) + ["", "", ""])[:3]
    if not component.startswith("/"):
        component = path
    why = f"mode {mode.zfill(4)}, owner {owner}" if mode.isdigit() else "its symlinks do not resolve"
    on_node = f"sudo chown root:root {shlex.quote(component)} && sudo chmod go-w {shlex.quote(component)}"
    return {"problem": f"{what} at {path} was not run on {node}: {component} can be changed by a user other than "
                       f"root ({why}), who could make the probe, which runs as root, run anything",
            "hint": f"make it root's alone (or install {what} where only root can write): "
                    f"ssh {target} {shlex.quote(on_node)}"}
