"""The readiness verdict on the real H200 report, on the fault fixtures derived from it (the table in
tests/fixtures/nvidia-h200/README.md), on Xid events and on InfiniBand ports (pure)."""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from llmgw_pulumi.health import readiness
from llmgw_pulumi.health.parsers import SmiReport, parse_ib_ports, parse_smi_xml, parse_xid_events
from llmgw_pulumi.health.readiness import CRITICAL, WARNING, Expectations, HcaExpectation, Problem, verdict
from tests.fixtures.faults import FAULTS
from tests.unit.health_samples import DECLARED, FIXTURES, IB_ROOT, REAL_XML, UUID0, sysfs_lines

H200 = FIXTURES / "nvidia-h200"
BUS0 = "00000000:00:06.0"


def apply_edits(xml: str, edits: list[tuple[str, str]]) -> str:
    """``xml`` with each element at ``path`` (under <gpu>; from the root with a leading /) holding ``value``."""
    root = ET.fromstring(xml)
    gpu = root.find("gpu")
    assert gpu is not None
    for path, value in edits:
        el = root.find(path[1:]) if path.startswith("/") else gpu.find(path)
        assert el is not None, f"{path} is not in the real XML"
        el.text = value
    return ET.tostring(root, encoding="unicode")


def n_gpu_xml(n: int, xml: str = REAL_XML) -> str:
    """An n-GPU report from the real one: GPU i has the recorded UUID with its last group counted up by i, and PCI
    device 06+i (as lab/doubles/nvidia_smi.py numbers its GPUs); minor number i; the rest as recorded."""
    root = ET.fromstring(xml)
    gpu = root.find("gpu")
    assert gpu is not None
    root.remove(gpu)
    head, _, last = UUID0.rpartition("-")
    for i in range(n):
        copy = ET.fromstring(ET.tostring(gpu))
        bus = f"00000000:00:{6 + i:02X}.0"
        copy.set("id", bus)
        for path, value in (("uuid", f"{head}-{int(last, 16) + i:012x}"), ("minor_number", str(i)),
                            ("pci/pci_bus_id", bus), ("pci/pci_device", f"{6 + i:02X}")):
            el = copy.find(path)
            assert el is not None
            el.text = value
        root.append(copy)
    count = root.find("attached_gpus")
    assert count is not None
    count.text = str(n)
    return ET.tostring(root, encoding="unicode")


def checks(problems: list[Problem]) -> list[tuple[str, str]]:
    return [(p.check, p.severity) for p in problems]


# --------------------------------------------------------------------------- the real node and its faults


def test_the_real_h200_as_declared_is_ready() -> None:
    problems = verdict("gpu-01", DECLARED, parse_smi_xml(REAL_XML))
    assert problems == [] and readiness.readiness(problems) == "ready"


def test_the_fault_table_is_read() -> None:
    assert len(FAULTS) == 23, [f[0] for f in FAULTS]
    assert {check for _, _, check, _, _ in FAULTS} >= {"ecc-disabled", "row-remap-pending", "pcie-width", "gpu-model"}


@pytest.mark.parametrize(("fault", "edits", "check", "severity", "fix"), FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_fixture_yields_its_one_problem(fault: str, edits: list[tuple[str, str]], check: str,
                                                  severity: str, fix: str) -> None:
    problems = verdict("gpu-01", DECLARED, parse_smi_xml(apply_edits(REAL_XML, edits)), target="deploy@10.0.0.5")
    assert checks(problems) == [(check, severity)], fault
    (p,) = problems
    assert p.node == "gpu-01" and fix in p.fix, p.fix
    if not all(path.startswith("/") for path, _ in edits):
        assert p.subject == f"GPU 0 ({UUID0}, {BUS0})"
    assert readiness.readiness(problems) == ("not ready" if severity == CRITICAL else "degraded")


def test_aggregate_ecc_errors_are_a_problem_of_their_own_only_beyond_the_volatile_ones() -> None:
    def found(volatile: str, aggregate: str) -> list[tuple[str, str]]:
        edits = [("ecc_errors/volatile/dram_uncorrectable", volatile), ("ecc_errors/aggregate/dram_uncorrectable", aggregate)]
        return checks(verdict("n", DECLARED, parse_smi_xml(apply_edits(REAL_XML, edits))))

    assert found("2", "2") == [("ecc-uncorrectable-volatile", CRITICAL)]
    assert found("2", "5") == [("ecc-uncorrectable-volatile", CRITICAL), ("ecc-uncorrectable-aggregate", CRITICAL)]
    assert found("0", "1") == [("ecc-uncorrectable-aggregate", CRITICAL)]


def test_a_gpu_idle_by_its_clocks_is_idle_where_utilisation_is_not_reported() -> None:
    # Some GPUs (vGPU, MIG) report no utilisation: the gpu_idle clock event reason alone says idle, and gen 1 is a
    # warning; with that reason Not Active too, nothing says idle and gen 1 is critical.
    gen1 = [("pci/pci_gpu_link_info/pcie_gen/current_link_gen", "1"), ("utilization/gpu_util", "N/A")]
    assert checks(verdict("n", DECLARED, parse_smi_xml(apply_edits(REAL_XML, gen1)))) == [("pcie-gen", WARNING)]
    busy = [*gen1, ("clocks_event_reasons/clocks_event_reason_gpu_idle", "Not Active")]
    assert checks(verdict("n", DECLARED, parse_smi_xml(apply_edits(REAL_XML, busy)))) == [("pcie-gen", CRITICAL)]


def test_a_gpu_reset_is_quoted_for_both_shells_and_names_the_gpu_by_index() -> None:
    edits = [("remapped_rows/remapped_row_pending", "Yes")]
    smi = parse_smi_xml(apply_edits(n_gpu_xml(3), edits))
    (p,) = verdict("gpu-01", replace(DECLARED, gpu_count=3), smi, target="deploy@10.0.0.5")
    assert "ssh deploy@10.0.0.5 sudo nvidia-smi -r -i 0" in p.fix
    (p,) = verdict("gpu-01", replace(DECLARED, gpu_count=3), smi)
    assert "sudo nvidia-smi -r -i 0" in p.fix and "ssh" not in p.fix
    (p,) = verdict("gpu-01", replace(DECLARED, gpu_count=3), smi, target="deploy@h;reboot")
    assert "ssh 'deploy@h;reboot' sudo nvidia-smi -r -i 0" in p.fix
    assert shlex.split(p.fix.rsplit("reset it: ", 1)[1].split(" (or")[0]) == [
        "ssh", "deploy@h;reboot", "sudo", "nvidia-smi", "-r", "-i", "0"]


def test_the_problem_has_the_shape_of_enginechecks_problems() -> None:
    (p,) = verdict("gpu-01", DECLARED, parse_smi_xml(apply_edits(REAL_XML, [("ecc_mode/current_ecc", "Disabled")])))
    d = p.as_dict()
    assert set(d) == {"check", "subject", "severity", "found", "expected", "problem", "hint"}
    assert d["hint"] == p.fix and "gpu-01" in d["problem"] and UUID0 in d["problem"] and "Disabled" in d["problem"]


# --------------------------------------------------------------------------- what was declared


def test_an_eight_gpu_node_with_a_gpu_missing_is_not_ready() -> None:
    eight = parse_smi_xml(n_gpu_xml(8))
    assert [g.index for g in eight.gpus] == list(range(8)) and len({g.uuid for g in eight.gpus}) == 8
    assert verdict("gpu-01", replace(DECLARED, gpu_count=8), eight) == []
    seven = parse_smi_xml(n_gpu_xml(7))
    problems = verdict("gpu-01", replace(DECLARED, gpu_count=8), seven)
    assert checks(problems) == [("gpu-count", CRITICAL)] and problems[0].found.startswith("7 ")
    assert checks(verdict("gpu-01", replace(DECLARED, gpu_count=6), seven)) == [("gpu-count", WARNING)]


def test_the_model_is_compared_whole_ignoring_case_and_space() -> None:
    smi = parse_smi_xml(REAL_XML)
    assert verdict("n", Expectations(gpu_model="  nvidia h200 "), smi) == []
    assert checks(verdict("n", Expectations(gpu_model="H200"), smi)) == [("gpu-model", CRITICAL)]
    assert checks(verdict("n", Expectations(gpu_model="NVIDIA H200 NVL"), smi)) == [("gpu-model", CRITICAL)]


@pytest.mark.parametrize(("declared", "found"), [
    (143771, []), (145000, []), (142400, []),
    (146000, [("gpu-memory", CRITICAL)]), (141000, [("gpu-memory", WARNING)]), (81559, [("gpu-memory", WARNING)]),
])
def test_memory_is_compared_within_one_percent(declared: int, found: list[tuple[str, str]]) -> None:
    assert checks(verdict("n", Expectations(gpu_memory_mib=declared), parse_smi_xml(REAL_XML))) == found


@pytest.mark.parametrize(("least", "ok"), [("580.159.04", True), ("580.159.4", True), ("580.65.06", True),
                                           ("580.159.05", False), ("580.1000", False), ("9999", False), ("580", True)])
def test_driver_versions_compare_as_numbers(least: str, ok: bool) -> None:
    problems = verdict("n", Expectations(min_driver=least), parse_smi_xml(REAL_XML))
    assert checks(problems) == ([] if ok else [("driver-version", CRITICAL)])


@pytest.mark.parametrize(("least", "ok"), [("13.0", True), ("12.10", True), ("13", True), ("13.0.0", True),
                                           ("13.0.1", False), ("13.1", False)])
def test_cuda_versions_compare_as_numbers(least: str, ok: bool) -> None:
    problems = verdict("n", Expectations(min_cuda=least), parse_smi_xml(REAL_XML))
    assert checks(problems) == ([] if ok else [("cuda-version", CRITICAL)])


def test_a_version_the_node_does_not_report_fails_a_declared_minimum() -> None:
    smi = parse_smi_xml(apply_edits(REAL_XML, [("/driver_version", "N/A")]))
    assert checks(verdict("n", Expectations(min_driver="550"), smi)) == [("driver-version", CRITICAL)]
    assert verdict("n", Expectations(), smi) == [], "nothing declared, nothing compared"


@pytest.mark.parametrize(("value", "bad"), [("550.54.15", False), ("12.4", False), ("580", False), ("v550", True),
                                            ("550.", True), ("", True), (550, True), ("5 50", True)])
def test_the_version_validator(value: object, bad: bool) -> None:
    problem = readiness.dotted_version(value)
    assert (problem is not None) == bad
    if problem:
        assert repr(value) in problem[0] and "e.g." in problem[1]


# --------------------------------------------------------------------------- nvidia-smi that says nothing useful


@pytest.mark.parametrize("text", ["No devices were found\n", "<nvidia_smi_log></nvidia_smi_log>", BUS0])
def test_unreadable_nvidia_smi_is_one_critical_problem(text: str) -> None:
    problems = verdict("gpu-01", DECLARED, parse_smi_xml(text), target="deploy@h")
    assert checks(problems) == [("nvidia-smi-unreadable", CRITICAL)]
    assert "ssh deploy@h nvidia-smi -q -x" in problems[0].fix and problems[0].subject == "nvidia-smi"


def test_a_node_without_nvidia_smi_has_no_gpus() -> None:
    assert checks(verdict("n", DECLARED, None)) == [("gpu-count", CRITICAL)]
    assert verdict("n", Expectations(), None) == []
    assert readiness.readiness([]) == "ready"


# --------------------------------------------------------------------------- Xid events


XID_LOG = (FIXTURES / "xid" / "dmesg-T.txt").read_text()


def test_each_xid_code_on_each_gpu_is_one_problem_with_its_documented_action() -> None:
    problems = verdict("gpu-01", DECLARED, parse_smi_xml(REAL_XML), parse_xid_events(XID_LOG), target="deploy@h")
    by_code = {int(re.match(r"Xid (\d+)", p.found).group(1)): p for p in problems}  # type: ignore[union-attr]
    assert {p.check for p in problems} == {"xid"} and sorted(by_code) == [13, 63, 69, 79, 94, 154]
    assert {c: p.severity for c, p in by_code.items()} == {13: WARNING, 63: CRITICAL, 69: WARNING, 79: CRITICAL,
                                                           94: WARNING, 154: CRITICAL}
    assert "(2 times)" in by_code[13].found and "restart the application" in by_code[13].fix
    assert by_code[63].subject == f"GPU 0 ({UUID0}, {BUS0})" and "nvidia-smi -r -i 0" in by_code[63].fix
    assert by_code[79].subject == "the GPU at PCI 0000:00:07", "not a GPU nvidia-smi listed: named by its bus id"
    assert "sudo systemctl reboot" in by_code[79].fix and "reseated or serviced" in by_code[79].fix
    assert "sudo systemctl reboot" in by_code[154].fix, "the driver asked for a reboot"
    assert "Xid catalog" in by_code[69].fix
    assert readiness.readiness(problems) == "not ready"


def test_an_xid_on_a_gpu_nvidia_smi_does_not_list_is_reset_by_its_bus_id() -> None:
    events = parse_xid_events("NVRM: Xid (PCI:0000:b3:00): 95, pid=7, name=x, Uncontained: FBHUB.\n")
    (p,) = verdict("n", Expectations(), parse_smi_xml(REAL_XML), events)
    assert (p.check, p.severity) == ("xid", CRITICAL) and "nvidia-smi -r -i 00000000:B3:00.0" in p.fix


def test_only_application_xids_leave_the_node_degraded() -> None:
    events = parse_xid_events("NVRM: Xid (PCI:0000:00:06): 31, pid=1, name=a, MMU Fault\n"
                              "NVRM: Xid (PCI:0000:00:06): 43, pid=1, name=a, Ch 00000008\n")
    problems = verdict("n", DECLARED, parse_smi_xml(REAL_XML), events)
    assert checks(problems) == [("xid", WARNING)] * 2 and readiness.readiness(problems) == "degraded"


def test_the_xid_table_names_the_codes_needing_a_reset_reboot_or_service() -> None:
    # NVIDIA's Xid catalog: 62, 64, 95, 119, 120 and 140 need a GPU reset, 79 the machine restarted; 92 (corrected
    # errors) is to be watched and 94 (contained) needs only the application restarted.
    severe = {code for code, m in readiness.XID_CODES.items() if m.action not in ("application", "monitor")}
    assert {48, 62, 63, 64, 74, 79, 95, 119, 120, 140, 154} <= severe
    assert (readiness.XID_CODES[92].action, readiness.XID_CODES[94].action) == ("monitor", "application")


def test_a_high_rate_of_corrected_errors_is_a_warning_to_watch() -> None:
    events = parse_xid_events("NVRM: Xid (PCI:0000:00:06): 92, pid=1, name=a, High single-bit ECC error rate\n")
    (p,) = verdict("n", DECLARED, parse_smi_xml(REAL_XML), events)
    assert (p.check, p.severity) == ("xid", WARNING) and "watch GPU 0" in p.fix
    assert all(m.meaning and m.meaning[0].islower() for m in readiness.XID_CODES.values())


# --------------------------------------------------------------------------- InfiniBand

IB_DECLARED = tuple(HcaExpectation(h, "ACTIVE", 400) for h in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"))


def test_each_ib_port_not_as_declared_is_one_critical_problem() -> None:
    ports = parse_ib_ports(sysfs_lines(IB_ROOT))
    problems = verdict("gpu-01", Expectations(hcas=IB_DECLARED), parse_smi_xml(REAL_XML), ports=ports,
                       target="deploy@h")
    assert [(p.subject, p.check, p.severity) for p in problems] == [
        ("mlx5_1 port 1", "ib-phys-state", CRITICAL), ("mlx5_2 port 1", "ib-rate", CRITICAL),
        ("mlx5_3 port 1", "ib-state", CRITICAL)]
    assert all("fix the fabric" in p.fix and "ssh deploy@h ibstat mlx5_" in p.fix for p in problems)
    assert "200 Gb/sec" in problems[1].found and "400 Gb/sec" in problems[1].expected


def test_ports_are_judged_only_for_declared_hcas_and_a_declared_hca_without_ports_is_critical() -> None:
    ports = parse_ib_ports(sysfs_lines(IB_ROOT))
    smi = parse_smi_xml(REAL_XML)
    assert verdict("n", Expectations(hcas=(HcaExpectation("mlx5_0", "ACTIVE", 400),)), smi, ports=ports) == []
    assert verdict("n", Expectations(), smi, ports=ports) == []
    problems = verdict("n", Expectations(hcas=(HcaExpectation("mlx5_9"),)), smi, ports=ports)
    assert checks(problems) == [("ib-no-port", CRITICAL)] and "/sys/class/infiniband/mlx5_9/ports" in problems[0].fix


def test_a_port_declared_down_is_down_and_no_minimum_rate_means_any() -> None:
    ports = parse_ib_ports(sysfs_lines(IB_ROOT))
    smi = parse_smi_xml(REAL_XML)
    assert verdict("n", Expectations(hcas=(HcaExpectation("mlx5_1", "DOWN"),)), smi, ports=ports) == []
    assert verdict("n", Expectations(hcas=(HcaExpectation("mlx5_2", "ACTIVE", 0),)), smi, ports=ports) == []
    assert checks(verdict("n", Expectations(hcas=(HcaExpectation("mlx5_0", "DOWN"),)), smi, ports=ports)) == [
        ("ib-state", CRITICAL)]


def test_an_unreadable_port_is_not_as_declared() -> None:
    ports = parse_ib_ports("ib-port\tmlx5_0\t1\t\t\t\n")
    problems = verdict("n", Expectations(hcas=(HcaExpectation("mlx5_0", "ACTIVE", 400),)), SmiReport(), ports=ports)
    assert checks(problems) == [("ib-phys-state", CRITICAL)] and "unreadable" in problems[0].found
    no_rate = parse_ib_ports("ib-port\tmlx5_0\t1\t4: ACTIVE\t5: LinkUp\t\n")
    problems = verdict("n", Expectations(hcas=(HcaExpectation("mlx5_0", "ACTIVE", 400),)), SmiReport(), ports=no_rate)
    assert checks(problems) == [("ib-rate", CRITICAL)] and "unreadable" in problems[0].found
    assert verdict("n", Expectations(hcas=(HcaExpectation("mlx5_0"),)), SmiReport(), ports=no_rate) == [], \
        "no rate declared: an unreadable one is no problem"


# --------------------------------------------------------------------------- readiness


@pytest.mark.parametrize(("severities", "verdict_"), [((), "ready"), ((WARNING,), "degraded"),
                                                      ((WARNING, WARNING), "degraded"), ((WARNING, CRITICAL), "not ready"),
                                                      ((CRITICAL,), "not ready")])
def test_readiness(severities: tuple[str, ...], verdict_: str) -> None:
    problems = [Problem("n", "s", "c", "f", "e", s, "x") for s in severities]  # type: ignore[arg-type]
    assert readiness.readiness(problems) == verdict_
