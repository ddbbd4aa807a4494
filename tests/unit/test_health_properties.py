"""Property-based tests (Hypothesis) of the health parsers and the verdict: whatever a node prints, no exception,
and only printable text reaches the operator."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import astuple, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_pulumi.health.parsers import parse_ib_ports, parse_smi_xml, parse_xid_events
from llmgw_pulumi.health.readiness import HcaExpectation, Problem, verdict
from tests.unit.health_samples import DECLARED, REAL_XML

HOSTILE = st.sampled_from(["", "N/A", "Yes", "No", "Active", "Not Active", "Enabled", "Disabled", "-1", "99999999999999999999",
                           "16x", "0 %", "x", "\u202e", "1e9", " 7 ", "\u00a0", "<", "&", "]]>"]) | st.text(max_size=12)
EXPECT = replace(DECLARED, hcas=(HcaExpectation("mlx5_0", "ACTIVE", 400),))


def _paths(el: ET.Element | None, here: tuple[str, ...]) -> list[tuple[str, ...]]:
    assert el is not None
    if not len(el):
        return [here] if here else []
    return [p for child in el for p in _paths(child, (*here, child.tag))]


LEAVES = sorted({"/".join(p) for p in _paths(ET.fromstring(REAL_XML).find("gpu"), ())})
"""The path of every leaf element of the real report's <gpu>."""
ANY = settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])


def printable_everywhere(problems: Sequence[Problem]) -> bool:
    return all(isinstance(f, str) and f.isprintable() for p in problems for f in astuple(p))


def test_the_leaves_are_found() -> None:
    assert len(LEAVES) > 100 and "ecc_mode/current_ecc" in LEAVES and "remapped_rows/remapped_row_pending" in LEAVES


@ANY
@given(st.text(max_size=300))
def test_any_text_is_a_report_or_an_error_never_an_exception(text: str) -> None:
    report = parse_smi_xml(text)
    assert report.error or report.gpus
    assert report.error.isprintable()
    problems = verdict("n", EXPECT, report, parse_xid_events(text), parse_ib_ports(text), target="u@h")
    assert problems and printable_everywhere(problems)  # (any text is no H200: count, model... or unreadable)


@ANY
@given(st.lists(st.tuples(st.sampled_from(LEAVES), HOSTILE), min_size=1, max_size=6), HOSTILE)
def test_any_values_in_the_real_report_give_problems_never_an_exception(edits: list[tuple[str, str]], node: str) -> None:
    root = ET.fromstring(REAL_XML)
    gpu = root.find("gpu")
    assert gpu is not None
    for path, value in edits:
        el = gpu.find(path)
        assert el is not None
        el.text = value
    report = parse_smi_xml(ET.tostring(root, encoding="unicode"))
    assert report.error or len(report.gpus) == 1
    problems = verdict(node or "gpu-01", EXPECT, report, target="u@h")
    assert printable_everywhere(problems)


@ANY
@given(st.lists(st.sampled_from(["NVRM: Xid (PCI:0000:00:06): ", "pid=", "name=", ", ", "79", "13", "'", "\t", "\n",
                                 "ib-port", "mlx5_0", "4: ACTIVE", "5: LinkUp", "400 Gb/sec", "\x1b", "\u202e"])
                | st.text(max_size=6), max_size=30).map("".join))
def test_kernel_log_and_sysfs_lines_never_raise_and_stay_printable(text: str) -> None:
    events = parse_xid_events(text)
    ports = parse_ib_ports(text)
    assert all(e.message.isprintable() and e.pci_bus_id.isprintable() for e in events)
    assert all(p.hca.isprintable() and p.port.isprintable() and p.rate_text.isprintable() for p in ports)
    problems = verdict("n", EXPECT, parse_smi_xml(REAL_XML), events, ports, target="u@h")
    assert printable_everywhere(problems)
