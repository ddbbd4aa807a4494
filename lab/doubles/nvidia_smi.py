"""A stand-in for `nvidia-smi` that replays the real output of an H200 node (``../shared/fixtures/nvidia-h200``).

``build_nvidia_smi(gpus=1)`` is a POSIX sh script answering, with the fixture
files' text, exactly what is recorded: plain ``nvidia-smi``, ``-L``,
``--version``, ``--query-gpu=<the fields of query-gpu.csv> --format=csv`` and
``--query-gpu=<those and memory.used, as captured> --format=csv,noheader,nounits``
(the query llmgw_pulumi's inventory makes) and ``-q -x`` (the readiness verdict's report; with ``edits``, a
fault of the fixtures' README made on one GPU). A query naming a field nvidia-smi
does not have fails as the real one does (query-bad-field.txt: its message on
stdout, exit 2); anything else was not recorded and fails with nvidia-smi's
usage error, exit 2.

With ``gpus=N`` it is an N-GPU node built from the one recorded: GPU i has
index i, the recorded UUID with its last group counted up by i, and PCI
device 06+i; the rest as recorded. ``failing_nvidia_smi()`` is one whose
driver is gone (nvidia-smi's own message for it, exit 9).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures" / "nvidia-h200"

QUERY_NOHEADER_FIELDS = "index,uuid,name,memory.total,memory.used,driver_version,pci.bus_id,compute_cap"
"""The fields query-gpu-noheader-nounits.csv was captured with."""

_USAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")


@dataclass(frozen=True)
class _Gpu:
    index: int
    uuid: str
    bus_id: str


def _gpus(fixtures: Path, n: int) -> list[_Gpu]:
    row = [c.strip() for c in (fixtures / "query-gpu-noheader-nounits.csv").read_text().split(",")]
    uuid, bus = row[1], row[6]
    head, _, last = uuid.rpartition("-")
    domain, _, dev = bus.rpartition(":")  # 00000000:00 and 06.0
    device, _, function = dev.partition(".")
    return [_Gpu(i, f"{head}-{int(last, 16) + i:0{len(last)}x}", f"{domain}:{int(device, 16) + i:02x}.{function}")
            for i in range(n)]


def _per_gpu(line: str, first: _Gpu, gpu: _Gpu) -> str:
    """A line about the recorded GPU, about ``gpu`` instead."""
    return line.replace(first.uuid, gpu.uuid).replace(first.bus_id, gpu.bus_id)


def _csv_rows(text: str, first: _Gpu, gpus: list[_Gpu], header: bool) -> str:
    lines = text.splitlines()
    head, row = (lines[:1], lines[1]) if header else ([], lines[0])
    rows = [str(g.index) + _per_gpu(row, first, g)[len(str(first.index)):] for g in gpus]
    return "\n".join(head + rows) + "\n"


def _plain(text: str, first: _Gpu, gpus: list[_Gpu]) -> str:
    """The plain table: the recorded header, one 3-line block (and its rule) per GPU, the processes."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|===")) + 1
    block, rule, tail = lines[start:start + 3], lines[start + 3], lines[start + 4:]
    out = lines[:start]
    for g in gpus:
        first_line = _per_gpu(block[0], first, g).replace(f"|   {first.index}  ", f"|   {g.index}  ", 1)
        out += [first_line, *block[1:], rule]
    return "\n".join(out + tail) + "\n"


def _listing(text: str, first: _Gpu, gpus: list[_Gpu]) -> str:
    line = text.splitlines()[0]
    return "".join(_per_gpu(line, first, g).replace(f"GPU {first.index}:", f"GPU {g.index}:", 1) + "\n" for g in gpus)


Edit = tuple[str, str]
"""``(path, value)``: the element at ``path`` under a ``<gpu>`` (from the root ``<nvidia_smi_log>`` when it starts
with ``/``) holds ``value``: the fault edits of tests/fixtures/nvidia-h200/README.md."""


def smi_xml(gpus: int = 1, edits: Sequence[Edit] = (), fixtures: Path = FIXTURES, gpu: int = 0) -> str:
    """``nvidia-smi -q -x`` of an N-GPU node made from the recorded one, with ``edits`` made on GPU ``gpu`` (or the
    root): the recorded file as it is for one GPU and no edit; otherwise its first two lines (the XML declaration
    and nvidia-smi's DOCTYPE) and the edited tree, each GPU numbered as the other answers number them."""
    recorded = (fixtures / "nvidia-smi-q.xml").read_text()
    if gpus == 1 and not edits:
        return recorded
    first, *rest = _gpus(fixtures, gpus)
    root = ET.fromstring(recorded.split("\n", 2)[2])
    element = root.find("gpu")
    assert element is not None, "the recorded report has a <gpu>"
    root.remove(element)
    recorded_gpu = ET.tostring(element, encoding="unicode")
    for g in (first, *rest):
        copy = ET.fromstring(_per_gpu(recorded_gpu, first, g).replace(first.bus_id.upper(), g.bus_id.upper()))
        for path, value in (("minor_number", str(g.index)), ("pci/pci_device", g.bus_id.split(":")[-1][:2].upper())):
            if (el := copy.find(path)) is not None:
                el.text = value
        root.append(copy)
    if (count := root.find("attached_gpus")) is not None:
        count.text = str(gpus)
    target = root.findall("gpu")[gpu]
    for path, value in edits:
        el = root.find(path[1:]) if path.startswith("/") else target.find(path)
        if el is None:
            raise ValueError(f"{path} is not an element of the recorded nvidia-smi -q -x")
        el.text = value
    head = "".join(recorded.splitlines(keepends=True)[:2])
    return head + ET.tostring(root, encoding="unicode") + "\n"


def _heredoc(text: str) -> str:
    assert "NVSMI_END" not in text
    return f"cat <<'NVSMI_END'\n{text}NVSMI_END\n"


def build_nvidia_smi(gpus: int = 1, fixtures: Path = FIXTURES, edits: Sequence[Edit] = (), gpu: int = 0) -> str:
    """The stand-in's text (install it executable as nvidia-smi). ``edits``: a fault of GPU ``gpu`` in its
    ``-q -x`` report (see ``smi_xml``); the other answers stay as recorded."""
    all_gpus = _gpus(fixtures, gpus)
    first = all_gpus[0]
    read = lambda name: (fixtures / name).read_text()  # noqa: E731
    header_fields = read("query-gpu.csv").splitlines()[0]
    query_fields = ",".join(f.strip().split(" [")[0] for f in header_fields.split(","))
    bad = read("query-bad-field.txt").splitlines()
    rc = next(line.split("=")[1] for line in bad if line.startswith("rc="))
    known = sorted(set(query_fields.split(",")) | set(QUERY_NOHEADER_FIELDS.split(",")))
    answers = {
        "": _plain(read("nvidia-smi.txt"), first, all_gpus),
        "-L": _listing(read("nvidia-smi-L.txt"), first, all_gpus),
        "--version": read("nvidia-smi-version.txt"),
        "-q -x": smi_xml(gpus, edits, fixtures, gpu),
        f"--query-gpu={query_fields} --format=csv": _csv_rows(read("query-gpu.csv"), first, all_gpus, True),
        f"--query-gpu={QUERY_NOHEADER_FIELDS} --format=csv,noheader,nounits":
            _csv_rows(read("query-gpu-noheader-nounits.csv"), first, all_gpus, False),
    }
    cases = "".join(f"'{args}')\n{_heredoc(text)};;\n" for args, text in answers.items())
    message = bad[0].replace('"nonsense"', '"%s"')
    return f"""#!/bin/sh
# nvidia-smi stand-in (llmgw-pulumi lab, lab/doubles/nvidia_smi.py): {gpus} GPU(s), replaying the real
# output of an H200 node. It answers only what was recorded.
case "$*" in
{cases}--query-gpu=*)
  fields=${{1#--query-gpu=}} known=" {' '.join(known)} "
  for f in $(printf '%s' "$fields" | tr ',' ' '); do
    case $known in
    *" $f "*) ;;
    *) printf '{message}\\n\\n' "$f"; exit {rc} ;;
    esac
  done
  echo "nvidia-smi stand-in: this query was not recorded: $*" >&2; exit 2 ;;
*) echo "{_USAGE}"; exit 2 ;;
esac
"""


def failing_nvidia_smi() -> str:
    """An nvidia-smi whose driver does not answer: every call prints nvidia-smi's message for it and exits 9."""
    return f"#!/bin/sh\necho \"{_NO_DRIVER}\"\nexit 9\n"
